-- Takes the keys of the jobs about to be sent, in the enqueue's transaction: one row per key of
-- $2 (distinct), with its fingerprint $3 and provider key $4, in queue $1 (the record scope).
-- Per key: `created` if this statement inserted its row; else the row that holds it, with the
-- message it sent and whether that message failed and its record is still kept (`failed`: a
-- replay moves `job_id` to the replayed message, and a record closed as confirmed or failed
-- again no longer answers for it). A key whose row another transaction is inserting waits for it
-- here, then is missing from the answer (this statement's snapshot predates it): asked again.
WITH job AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::uuid[]) AS job(idempotency_key, fingerprint, provider_key)
), fresh AS (
    INSERT INTO {schema}.broker_keys (queue, idempotency_key, fingerprint, provider_key)
    SELECT $1, idempotency_key, fingerprint, provider_key FROM job
    ON CONFLICT (queue, idempotency_key) DO NOTHING
    RETURNING idempotency_key, fingerprint, provider_key
)
SELECT idempotency_key, fingerprint, provider_key, NULL::text AS job_id, true AS created, false AS failed
FROM fresh
UNION ALL
SELECT k.idempotency_key, k.fingerprint, k.provider_key, k.job_id, false, EXISTS (
           SELECT 1 FROM {schema}.broker_records r
           WHERE r.queue = $1 AND r.idempotency_key = k.idempotency_key AND r.job_id = k.job_id
             AND r.state NOT IN ('confirmed', 'failed_again'))
FROM {schema}.broker_keys k JOIN job ON job.idempotency_key = k.idempotency_key
WHERE k.queue = $1 AND NOT EXISTS (SELECT 1 FROM fresh WHERE fresh.idempotency_key = k.idempotency_key)
