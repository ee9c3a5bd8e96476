-- The replayed job of record ?1 failed again at ?2 into record ?3: the old record says so.
UPDATE redrive_failed_jobs SET state = 'failed_again', failed_again_at = ?2, next_record = ?3
WHERE id = ?1 AND state = 'replaying'
