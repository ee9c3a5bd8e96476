-- Closes open record ?1 as replayed at ?2.
UPDATE redrive_failed_jobs SET state = 'replayed', closed_at = ?2 WHERE id = ?1 AND state = 'open'
