-- Many jobs in one statement; keys that already exist are skipped, and a key given twice is
-- created by its first copy. Ids follow the order of the input, so the jobs run in that order.
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::jsonb[], $5::text[], $6::text[], $7::int[])
        WITH ORDINALITY AS i(kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, n)
), first AS (
    SELECT DISTINCT ON (idempotency_key) * FROM input ORDER BY idempotency_key, n
), key AS (
    INSERT INTO {schema}.job_keys (idempotency_key, fingerprint)
    SELECT idempotency_key, fingerprint FROM first ORDER BY n
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, idempotency_key
)
INSERT INTO {schema}.jobs (id, kind, idempotency_key, provider_key, payload, severity, cap)
SELECT key.job_id, f.kind, f.idempotency_key, f.provider_key, f.payload, f.severity, f.cap
FROM key JOIN first f USING (idempotency_key)
ORDER BY key.job_id
RETURNING id, idempotency_key
