-- The jobs of keys a batch did not create, to tell duplicates from key conflicts, with their
-- stored provider keys and status (NULL if the job row is gone). One primary-key lookup per key, however few
-- rows the statistics expect: the LIMIT keeps the planner from folding the lateral subquery into
-- a join it may hash over a scan of the table.
SELECT k.job_id AS id, k.idempotency_key, k.fingerprint, k.provider_key, k.status
FROM unnest($1::text[]) AS wanted(key)
CROSS JOIN LATERAL (
    SELECT found.job_id, found.idempotency_key, found.fingerprint,
           (SELECT j.provider_key FROM {schema}.jobs j WHERE j.id = found.job_id) AS provider_key,
           (SELECT j.status FROM {schema}.jobs j WHERE j.id = found.job_id) AS status
    FROM {schema}.job_keys found
    WHERE found.idempotency_key = wanted.key
    LIMIT 1
) k
