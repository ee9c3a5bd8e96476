-- The replayed job of record ?1 is done: the record is confirmed at ?2 (if still replaying).
UPDATE redrive_failed_jobs SET state = 'confirmed', confirmed_at = ?2
WHERE id = ?1 AND state = 'replaying'
