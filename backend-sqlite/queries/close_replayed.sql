-- Marks open record ?1 replaying since ?2: ?3 reason, ?4 actor, ?5 the amended payload (NULL: the
-- record's own). Its job's completion confirms it.
UPDATE redrive_failed_jobs
SET state = 'replaying', closed_at = ?2, replay_reason = ?3, replay_actor = ?4, amended = ?5
WHERE id = ?1 AND state = 'open'
