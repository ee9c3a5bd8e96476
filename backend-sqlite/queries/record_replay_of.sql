-- Record ?1 follows record ?2: its job was replayed from it and failed again.
UPDATE redrive_failed_jobs SET replay_of = ?2 WHERE id = ?1
