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

-- A concurrency limit's slots: slot `slot` of the limit of `key`, held by `token` until `until`;
-- free where `until` is past (let go: '-infinity'). A key's rows are made by its first take (all
-- of its limit), and kept: a take then locks one free row, skipping those other takers hold, so
-- takers of one key do not wait for each other.
CREATE TABLE {schema}.flow_slots (
    key     text        NOT NULL,
    slot    integer     NOT NULL CHECK (slot >= 0),
    token   uuid,
    until   timestamptz NOT NULL,
    PRIMARY KEY (key, slot)
);
