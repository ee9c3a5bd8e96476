-- A job may carry a deadline (ms since the epoch): claimed after it, it is dropped unrun.
ALTER TABLE redrive_jobs ADD COLUMN deadline INTEGER;
