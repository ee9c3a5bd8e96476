-- Priorities (`Job::priority`): a claim takes the ready jobs of the highest priority first, and
-- oldest first within one. A constant default, so adding the column rewrites nothing; the range
-- check is NOT VALID (every row before it is 0), so adding it reads nothing either, and it holds
-- every row written after.
ALTER TABLE {schema}.jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_priority_range CHECK (priority BETWEEN -100 AND 100) NOT VALID;

-- Every priority a job was enqueued with, 0 always: a claim reads the ready index at each of these,
-- highest first, as a range of its own that ends at the first job not yet due. Rows are added by
-- the enqueue that first uses a priority, and kept (a priority no job has any more costs a claim
-- one empty look into the index).
CREATE TABLE {schema}.job_priorities (
    priority smallint PRIMARY KEY
);
INSERT INTO {schema}.job_priorities (priority) VALUES (0);

-- The ready index by priority, then as before. Each priority's range starts with its oldest ready
-- job and ends at its first scheduled one, so neither the other priorities' jobs nor the jobs not
-- yet due are read. Built in the migration's transaction, as `jobs_done` was.
DROP INDEX {schema}.jobs_ready;
CREATE INDEX jobs_ready ON {schema}.jobs (priority DESC, run_at, id) WHERE run_at IS NOT NULL;
