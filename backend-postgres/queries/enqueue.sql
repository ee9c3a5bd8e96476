-- Insert-or-skip on the key. Returns the new job (created = true), or else the existing one with
-- its fingerprint so the caller can tell a duplicate from a key conflict, and its provider key
-- (NULL if the job row is gone) so a producer learns the one the provider will see, and its status
-- (a failed job's key answers `Failed`, not `Duplicate`). The key row and the job
-- row are written by this one statement: both exist or neither does. A job with an order key
-- keeps the key's highest id as `order_prev` (see claim.sql). A priority other than 0 is added to
-- `job_priorities` by its first job (see claim.sql). $12: the producer's traceparent (or NULL).
WITH key AS (
    INSERT INTO {schema}.job_keys (idempotency_key, fingerprint)
    VALUES ($2, $5)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, fingerprint
), job AS (
    INSERT INTO {schema}.jobs (id, kind, idempotency_key, provider_key, payload, severity, cap, deadline, run_at,
                               order_key, order_prev, priority, traceparent)
    SELECT job_id, $1, $2, $3, $4, $6, $7, $8, coalesce($9, now()), $10,
           CASE WHEN $10::text IS NOT NULL
                THEN coalesce((SELECT max(id) FROM {schema}.jobs WHERE order_key = $10), 0) END,
           $11, $12
    FROM key
), level AS (
    INSERT INTO {schema}.job_priorities (priority)
    SELECT $11 FROM key WHERE $11::smallint <> 0
    ON CONFLICT (priority) DO NOTHING
)
SELECT job_id AS id, fingerprint, true AS created, $3::uuid AS provider_key, 'queued' AS status FROM key
UNION ALL
SELECT k.job_id, k.fingerprint, false, j.provider_key, j.status
FROM {schema}.job_keys k LEFT JOIN {schema}.jobs j ON j.id = k.job_id
WHERE k.idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM key)
