-- Failure records of broker queues (SQS, Azure Queue Storage), kept here because a broker's
-- dead-letter queue cannot be listed, paged or shared by readers. One table for every queue;
-- `queue` is the queue's ARN or URL.

CREATE TABLE {schema}.broker_records (
    queue           text        NOT NULL,
    id              text        NOT NULL,
    -- Insertion order: pages follow it.
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    job_id          text        NOT NULL,
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    -- The whole record as written (payload, error history), its text kept as it came (json, not
    -- jsonb); its `state` is the columns below.
    record          json        NOT NULL,
    -- open | replaying | replayed | discarded
    state           text        NOT NULL DEFAULT 'open',
    -- A replay's window: past it, a record still replaying reads as open again.
    replay_until    timestamptz,
    -- The closed state (`RecordState` as JSON).
    closed          jsonb,
    PRIMARY KEY (queue, id)
);

CREATE INDEX broker_records_page ON {schema}.broker_records (queue, seq);
CREATE INDEX broker_records_key ON {schema}.broker_records (queue, idempotency_key);
CREATE INDEX broker_records_unclosed ON {schema}.broker_records (queue) WHERE state IN ('open', 'replaying');
CREATE INDEX broker_records_age ON {schema}.broker_records (queue, last_failed_at);

-- Whether a record waits for a person: open, or taken by a replay whose window lapsed (its
-- replayer died before closing it). The one definition every broker query uses; inlined by the
-- planner.
CREATE FUNCTION {schema}.broker_unclosed(state text, replay_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT state = 'open' OR (state = 'replaying' AND replay_until < now()) $$;
