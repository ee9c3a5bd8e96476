-- The jobs of keys a batch did not create, to tell duplicates from key conflicts. One primary-key
-- lookup per key, however few rows the statistics expect: the LIMIT keeps the planner from folding
-- the lateral subquery into a join it may hash over a scan of the table.
SELECT k.job_id AS id, k.idempotency_key, k.fingerprint
FROM unnest($1::text[]) AS wanted(key)
CROSS JOIN LATERAL (
    SELECT job_id, idempotency_key, fingerprint FROM {schema}.job_keys WHERE idempotency_key = wanted.key LIMIT 1
) k
