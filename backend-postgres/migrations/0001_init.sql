-- redrive's tables. `{schema}` is replaced by the configured, validated and quoted schema name.

-- One row per job key, written once by the enqueue that creates the job: its primary key makes a
-- second enqueue a no-op. It is kept apart from `jobs` because a claim or a completion rewrites the
-- job row, and an update that changes an indexed column writes a new entry into every index of its
-- table; the wide, unique text key would be written (and checked) twice per job.
CREATE TABLE {schema}.job_keys (
    idempotency_key text      PRIMARY KEY,
    job_id          bigserial NOT NULL,
    fingerprint     text      NOT NULL  -- of the payload: a duplicate has the same, a reused key another
);

-- One row per intended effect. The row is the effect ledger entry of its own key (pending while
-- claimed, done with its result).
CREATE TABLE {schema}.jobs (
    id              bigint      PRIMARY KEY,          -- job_keys.job_id of its key
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    provider_key    uuid        NOT NULL,
    payload         jsonb       NOT NULL,
    severity        text        NOT NULL DEFAULT 'error',
    status          text        NOT NULL DEFAULT 'queued'
                    CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,   -- this run's attempts; a replay resets it
    claims          integer     NOT NULL DEFAULT 0,   -- every claim ever; > 1 means an earlier attempt started
    cap             integer     NOT NULL CHECK (cap >= 1),
    run_at          timestamptz DEFAULT now(),        -- when a queued job may run; NULL unless queued
    lease_token     uuid,
    locked_until    timestamptz,                      -- lease expiry; NULL unless running
    last_error      text,
    errors          jsonb       NOT NULL DEFAULT '[]', -- this run's failed attempts
    result          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'queued') = (run_at IS NOT NULL)),
    CHECK ((status = 'running') = (locked_until IS NOT NULL))
);
-- The partial indexes are keyed on nullness rather than on status: a claim's `run_at <= now()`
-- then implies the predicate, and the planner's estimate of it (a third of the rows) holds even
-- before the table has statistics, so a claim never sorts the whole backlog to take a batch.
CREATE INDEX jobs_ready ON {schema}.jobs (run_at, id) WHERE run_at IS NOT NULL;
CREATE INDEX jobs_leased ON {schema}.jobs (locked_until) WHERE locked_until IS NOT NULL;

-- Failure records: everything needed to understand and replay a job.
CREATE TABLE {schema}.failed_jobs (
    id              bigserial   PRIMARY KEY,
    job_id          bigint      NOT NULL,
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    provider_key    uuid        NOT NULL,
    payload         jsonb       NOT NULL,
    severity        text        NOT NULL,
    last_error      text        NOT NULL,
    errors          jsonb       NOT NULL,
    attempts        integer     NOT NULL,
    cap             integer     NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    state           text        NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'replayed', 'discarded')),
    closed_at       timestamptz,
    discard_reason  text,
    discarded_by    text
);
CREATE INDEX failed_jobs_open ON {schema}.failed_jobs (id) WHERE state = 'open';
CREATE INDEX failed_jobs_age ON {schema}.failed_jobs (last_failed_at);

-- The effect ledger for keys that are not Postgres jobs (another queue's jobs, explicit calls).
CREATE TABLE {schema}.processed_keys (
    idempotency_key text        PRIMARY KEY,
    fingerprint     text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'done')),
    holder          uuid,
    held_until      timestamptz,
    result          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Same-database effects: the key commits in the transaction that makes the effect.
CREATE TABLE {schema}.applied_effects (
    idempotency_key text        PRIMARY KEY,
    applied_at      timestamptz NOT NULL DEFAULT now()
);
