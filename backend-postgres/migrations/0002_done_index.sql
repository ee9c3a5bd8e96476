-- Finished jobs by when they finished, for `prune_done`. Without it each prune read the whole
-- table in id order to find the old done rows (a million-job backlog was read on every call).
-- Partial: only completions write to it.
CREATE INDEX jobs_done ON {schema}.jobs (updated_at) WHERE status = 'done';
