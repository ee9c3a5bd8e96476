-- Flow control, shared by every process that opens the file: paused kinds and limits, their audit
-- trail, the rate limits' buckets and the concurrency limits' slots. Times are milliseconds since
-- the epoch, as everywhere in the file; a bucket's time is in microseconds.

-- A kind's pause (its reason, by and at all set, or none) and its limits (NULL: no limit). A rate
-- is a count per period, the period in microseconds. A row with neither is kept, and not listed.
CREATE TABLE redrive_flow_kinds (
    kind            TEXT PRIMARY KEY,
    paused_reason   TEXT,
    paused_by       TEXT,
    paused_at       INTEGER,
    probe_at        INTEGER,                -- a breaker's pause: a probe may run from then on
    concurrency     INTEGER CHECK (concurrency >= 1),
    rate_count      INTEGER CHECK (rate_count >= 1),
    rate_per_us     INTEGER CHECK (rate_per_us >= 1000),
    key_concurrency INTEGER CHECK (key_concurrency >= 1),
    key_rate_count  INTEGER CHECK (key_rate_count >= 1),
    key_rate_per_us INTEGER CHECK (key_rate_per_us >= 1000),
    CHECK ((paused_at IS NULL) = (paused_by IS NULL) AND (paused_at IS NULL) = (paused_reason IS NULL)),
    CHECK (probe_at IS NULL OR paused_at IS NOT NULL),
    CHECK ((rate_count IS NULL) = (rate_per_us IS NULL)),
    CHECK ((key_rate_count IS NULL) = (key_rate_per_us IS NULL))
) WITHOUT ROWID;

-- The audit trail of pauses, resumes and limits; `seq` is commit order (one writer at a time).
CREATE TABLE redrive_flow_events (
    seq     INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    action  TEXT NOT NULL CHECK (action IN ('paused', 'resumed', 'limits')),
    by      TEXT NOT NULL,
    detail  TEXT NOT NULL
);

CREATE INDEX redrive_flow_events_kind ON redrive_flow_events (kind, seq);

-- A rate limit's bucket (GCRA): its theoretical arrival time, in microseconds.
CREATE TABLE redrive_flow_buckets (
    key TEXT PRIMARY KEY,
    tat INTEGER NOT NULL
) WITHOUT ROWID;

-- A concurrency limit's held slots: a row per slot taken and not let go, its holder's token the
-- fence, held until `until`; past it, the slot is free to be taken over.
CREATE TABLE redrive_flow_slots (
    key     TEXT NOT NULL,
    slot    INTEGER NOT NULL,
    token   TEXT NOT NULL,
    until   INTEGER NOT NULL,
    PRIMARY KEY (key, slot)
) WITHOUT ROWID;
