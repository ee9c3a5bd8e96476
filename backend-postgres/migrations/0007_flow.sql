-- Flow control, shared by every worker using this schema as its ledger: paused kinds and limits,
-- their audit trail, the rate limits' buckets and the concurrency limits' slots.

-- A kind's pause (all four pause columns set, or none) and its limits (NULL: no limit). A rate
-- is a count per period, the period in microseconds. A row with neither pause nor limits is
-- kept, and not listed.
CREATE TABLE {schema}.flow_kinds (
    kind                 text        PRIMARY KEY,
    paused_reason        text,
    paused_by            text,
    paused_at            timestamptz,
    -- A breaker's pause: a probe may run from then on. NULL for a person's pause.
    probe_at             timestamptz,
    concurrency          bigint      CHECK (concurrency >= 1),
    rate_count           bigint      CHECK (rate_count >= 1),
    rate_per_us          bigint      CHECK (rate_per_us >= 1000),
    key_concurrency      bigint      CHECK (key_concurrency >= 1),
    key_rate_count       bigint      CHECK (key_rate_count >= 1),
    key_rate_per_us      bigint      CHECK (key_rate_per_us >= 1000),
    CHECK ((paused_at IS NULL) = (paused_by IS NULL) AND (paused_at IS NULL) = (paused_reason IS NULL)),
    CHECK (probe_at IS NULL OR paused_at IS NOT NULL),
    CHECK ((rate_count IS NULL) = (rate_per_us IS NULL)),
    CHECK ((key_rate_count IS NULL) = (key_rate_per_us IS NULL))
);

-- The audit trail of pauses, resumes and limits, as a discard is kept on its record. `seq` orders
-- it: events in one transaction share their `at`.
CREATE TABLE {schema}.flow_events (
    seq     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    kind    text        NOT NULL,
    action  text        NOT NULL CHECK (action IN ('paused', 'resumed', 'limits')),
    by      text        NOT NULL,
    detail  text        NOT NULL
);

CREATE INDEX flow_events_kind ON {schema}.flow_events (kind, seq);

-- A rate limit's bucket (GCRA): its theoretical arrival time, in microseconds since the epoch of
-- the database's clock. `before` is the time before the last take: an upsert's RETURNING sees only
-- the row it wrote, and the take answers what it granted from the two.
CREATE TABLE {schema}.flow_buckets (
    key     text   PRIMARY KEY,
    tat     bigint NOT NULL,
    before  bigint
);

-- A concurrency limit's slots, all of a key's in one row, so that a take finds the first free one
-- and holds it in one upsert, which sees the row's latest version however many take it at once.
-- Slot i is `tokens[i + 1]` (its holder) held until `untils[i + 1]`; NULL or past: free.
CREATE TABLE {schema}.flow_slots (
    key     text          PRIMARY KEY,
    tokens  uuid[]        NOT NULL,
    untils  timestamptz[] NOT NULL
);

-- The first free slot among the first `n` (1-based), or NULL where all are held.
CREATE FUNCTION {schema}.flow_free_slot(untils timestamptz[], n bigint) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$ SELECT min(i) FROM generate_series(1, n) i WHERE untils[i] IS NULL OR untils[i] <= now() $$;
