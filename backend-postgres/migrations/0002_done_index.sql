-- Finished jobs by when they finished, for `prune_done`. Without it each prune read the whole
-- table in id order to find the old done rows (a million-job backlog was read on every call).
-- Partial: only completions write to it. Built in the migration's transaction, not CONCURRENTLY:
-- concurrent builds of partial indexes wait for one another, so migrating several schemas at once
-- deadlocked. The build holds writes to `jobs` back for its length (seconds for a million rows).
CREATE INDEX jobs_done ON {schema}.jobs (updated_at) WHERE status = 'done';
