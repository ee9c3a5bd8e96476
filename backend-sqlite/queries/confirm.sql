-- The replayed job ?3 of record ?1 is done: the record is confirmed at ?2 (if it is still
-- replaying, and still that job's: a record id can be reused after a purge).
UPDATE redrive_failed_jobs SET state = 'confirmed', confirmed_at = ?2
WHERE id = ?1 AND job_id = ?3 AND state = 'replaying'
