-- Failure records of broker queues (SQS, Azure Queue Storage), for a worker whose records live in
-- this file: a broker's dead-letter queue cannot be listed, paged or shared by readers. One table
-- for every queue; `queue` is the queue's scope (its ARN or URL).

CREATE TABLE redrive_broker_records (
    seq             INTEGER PRIMARY KEY,    -- insertion order (one writer: commit order); pages follow it
    queue           TEXT NOT NULL,
    id              TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    record          TEXT NOT NULL,          -- the whole record as written, JSON; its state is below
    state           TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'replaying', 'replayed', 'discarded')),
    replay_until    INTEGER,                -- a replay's window: past it, a record still replaying reads as open
    closed          TEXT,                   -- the closed state (`RecordState` as JSON)
    UNIQUE (queue, id)
);

CREATE INDEX redrive_broker_records_key ON redrive_broker_records (queue, idempotency_key);
CREATE INDEX redrive_broker_records_unclosed ON redrive_broker_records (queue) WHERE state IN ('open', 'replaying');
CREATE INDEX redrive_broker_records_age ON redrive_broker_records (queue, last_failed_at);
