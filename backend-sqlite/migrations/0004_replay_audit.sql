-- A replay keeps who asked for it and why, as a discard does; records replayed before read with
-- neither.
ALTER TABLE redrive_failed_jobs ADD COLUMN replay_reason TEXT;
ALTER TABLE redrive_failed_jobs ADD COLUMN replay_actor TEXT;
