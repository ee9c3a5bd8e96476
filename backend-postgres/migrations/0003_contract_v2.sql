-- Contract v2: crash refunds, provider keys in the ledger, lookups of failure records.

-- `started`: the current claim's handler started (its lease was renewed); a claim that lapses
-- without it gives its attempt back. `stranded`: how many claims did so. Both with constant
-- defaults, so adding them rewrites nothing.
ALTER TABLE {schema}.jobs
    ADD COLUMN started  boolean NOT NULL DEFAULT false,
    ADD COLUMN stranded integer NOT NULL DEFAULT 0;

-- The provider key minted with the first job that began a key; every later attempt and message
-- of the key is handed the same one. NULL on rows written before this migration.
ALTER TABLE {schema}.processed_keys ADD COLUMN provider_key uuid;

-- Records by job (purge drops a failed job once its last record goes; `FailureQuery::by_job`)
-- and by key (`FailureQuery::by_key`).
CREATE INDEX failed_jobs_job ON {schema}.failed_jobs (job_id);
CREATE INDEX failed_jobs_key ON {schema}.failed_jobs (idempotency_key);

-- `prune_done` prunes the ledger's done keys (other queues' jobs, alerts) and applied effects by
-- age: found by these, not by reading the tables whole.
CREATE INDEX processed_keys_done ON {schema}.processed_keys (updated_at) WHERE state = 'done';
CREATE INDEX applied_effects_age ON {schema}.applied_effects (applied_at);
