-- Closes open record ?1 as replayed at ?2. ?3 reason, ?4 actor.
UPDATE redrive_failed_jobs SET state = 'replayed', closed_at = ?2, replay_reason = ?3, replay_actor = ?4
WHERE id = ?1 AND state = 'open'
