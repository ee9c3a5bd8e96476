-- Cancel (`Jobs::cancel_job`): who cancelled a job, why and when, kept on the job as a discard is
-- kept on its record. A cancelled job is a finished one ('done', `done_at` its cancel) that never
-- ran: the claim, the order of a key and `prune_done` already treat it right, and the status
-- check, which SQLite could change only by rebuilding the table, stays as it is.
ALTER TABLE redrive_jobs ADD COLUMN cancelled_at INTEGER;
ALTER TABLE redrive_jobs ADD COLUMN cancel_reason TEXT;
ALTER TABLE redrive_jobs ADD COLUMN cancelled_by TEXT;
