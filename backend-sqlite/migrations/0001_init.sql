-- redrive's tables, prefixed so that they sit beside the application's own in one file.
-- Times are milliseconds since the Unix epoch (UTC), written by the process: every process that
-- opens the file shares the machine's clock.

CREATE TABLE redrive_jobs (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,   -- one job per key while it is kept: the enqueue dedupe
    provider_key    TEXT NOT NULL,
    payload         TEXT NOT NULL,          -- JSON
    fingerprint     TEXT NOT NULL,
    severity        TEXT NOT NULL,
    cap             INTEGER NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
    ready_at        INTEGER,                -- set exactly when queued
    lease_token     TEXT,                   -- set exactly when running: the fence
    lease_expires   INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    claims          INTEGER NOT NULL DEFAULT 0,  -- every claim, refunded or not: past the first, resumed
    started         INTEGER NOT NULL DEFAULT 0,  -- the current claim's handler started (renewed)
    stranded        INTEGER NOT NULL DEFAULT 0,  -- claims that lapsed before their handler started
    errors          TEXT NOT NULL DEFAULT '[]',  -- this run's attempt errors, JSON
    created_at      INTEGER NOT NULL,
    done_at         INTEGER,
    CHECK ((status = 'queued') = (ready_at IS NOT NULL)),
    CHECK ((status = 'running') = (lease_token IS NOT NULL))
);

-- A claim reads the ready jobs in order; the sweep reads the lapsed leases.
CREATE INDEX redrive_jobs_ready ON redrive_jobs (ready_at, id) WHERE status = 'queued';
CREATE INDEX redrive_jobs_running ON redrive_jobs (lease_expires) WHERE status = 'running';
CREATE INDEX redrive_jobs_done ON redrive_jobs (done_at) WHERE status = 'done';

CREATE TABLE redrive_failed_jobs (
    id              INTEGER PRIMARY KEY,
    job_id          INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    provider_key    TEXT NOT NULL,
    payload         TEXT NOT NULL,
    last_error      TEXT NOT NULL,
    errors          TEXT NOT NULL,          -- JSON: every failed attempt of the run
    attempts        INTEGER NOT NULL,
    cap             INTEGER NOT NULL,
    severity        TEXT NOT NULL,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    state           TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'replayed', 'discarded')),
    closed_at       INTEGER,
    discard_reason  TEXT,
    discard_actor   TEXT
);

CREATE INDEX redrive_failed_jobs_open ON redrive_failed_jobs (id) WHERE state = 'open';
CREATE INDEX redrive_failed_jobs_key ON redrive_failed_jobs (idempotency_key);
CREATE INDEX redrive_failed_jobs_job ON redrive_failed_jobs (job_id);
CREATE INDEX redrive_failed_jobs_age ON redrive_failed_jobs (last_failed_at);

-- The effect ledger of keys that are not this queue's jobs (a job's row is its key's entry: the
-- claim takes the key) and of alerts: one row per key, pending (held by a token until a time) or
-- done.
CREATE TABLE redrive_processed_keys (
    idempotency_key TEXT PRIMARY KEY,
    fingerprint     TEXT NOT NULL,
    provider_key    TEXT NOT NULL,
    token           TEXT,
    held_until      INTEGER,
    result          TEXT,                   -- JSON, set when done
    done_at         INTEGER
) WITHOUT ROWID;

-- Keys of same-database effects (`effect_once`), taken in the application's transaction.
CREATE TABLE redrive_applied_effects (
    idempotency_key TEXT PRIMARY KEY,
    applied_at      INTEGER NOT NULL
) WITHOUT ROWID;
