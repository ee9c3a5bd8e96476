-- Closes open record ?1 without a replay. ?2 now, ?3 reason, ?4 actor.
UPDATE redrive_failed_jobs
SET state = 'discarded', closed_at = ?2, discard_reason = ?3, discard_actor = ?4
WHERE id = ?1 AND state = 'open'
RETURNING id
