-- The replayed job ?4 of record ?1 failed again at ?2 into record ?3: the old record says so (if it
-- is still replaying, and still that job's: a record id can be reused after a purge).
UPDATE redrive_failed_jobs SET state = 'failed_again', failed_again_at = ?2, next_record = ?3
WHERE id = ?1 AND job_id = ?4 AND state = 'replaying'
