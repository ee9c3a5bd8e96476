-- Many jobs in one statement; keys that already exist are skipped, and a key given twice is
-- created by its first copy. Ids are drawn in the order of the input, so the jobs run in that
-- order; the keys are then inserted in key order, so that two batches sharing keys wait for each
-- other instead of deadlocking; the new priorities too (see claim.sql), in order.
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::jsonb[], $5::text[], $6::text[], $7::int[],
                         $8::timestamptz[], $9::timestamptz[], $10::text[], $11::smallint[], $12::text[])
        WITH ORDINALITY AS i(kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, deadline,
                             not_before, order_key, priority, traceparent, n)
), first AS (
    SELECT DISTINCT ON (idempotency_key) * FROM input ORDER BY idempotency_key, n
), numbered AS MATERIALIZED (
    SELECT f.*, nextval('{schema}.job_keys_job_id_seq') AS job_id FROM (SELECT * FROM first ORDER BY n) f
), key AS (
    INSERT INTO {schema}.job_keys (idempotency_key, job_id, fingerprint)
    SELECT idempotency_key, job_id, fingerprint FROM numbered ORDER BY idempotency_key
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, idempotency_key
), level AS (
    INSERT INTO {schema}.job_priorities (priority)
    SELECT DISTINCT priority FROM input WHERE priority <> 0 ORDER BY priority
    ON CONFLICT (priority) DO NOTHING
)
INSERT INTO {schema}.jobs (id, kind, idempotency_key, provider_key, payload, severity, cap, deadline, run_at,
                          order_key, order_prev, priority, traceparent)
SELECT key.job_id, f.kind, f.idempotency_key, f.provider_key, f.payload, f.severity, f.cap, f.deadline,
       coalesce(f.not_before, now()), f.order_key,
       -- The key's previous job in this batch (of those inserted: a skipped duplicate's id was
       -- never a job), else its highest id before the batch.
       CASE WHEN f.order_key IS NOT NULL
            THEN coalesce(lag(key.job_id) OVER (PARTITION BY f.order_key ORDER BY key.job_id),
                          (SELECT max(id) FROM {schema}.jobs WHERE order_key = f.order_key), 0) END,
       f.priority, f.traceparent
FROM key JOIN numbered f USING (idempotency_key)
ORDER BY key.job_id
RETURNING id, idempotency_key
