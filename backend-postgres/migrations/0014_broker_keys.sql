-- Idempotency keys of a queue that lives in this database beside the records (pgmq), so that an
-- enqueue is deduplicated exactly, as on `jobs`: the key row and the message are written in one
-- transaction, a second enqueue of the key finds the row (a duplicate, or a key conflict when its
-- payload's fingerprint differs). `queue` is the queue's record scope (`broker_records.queue`);
-- `job_id` the message the key last sent (a replay moves it to the replayed message).
CREATE TABLE {schema}.broker_keys (
    queue           text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    provider_key    uuid        NOT NULL,
    job_id          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, idempotency_key)
);
