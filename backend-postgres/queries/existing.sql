-- The jobs of keys a batch did not create, to tell duplicates from key conflicts, with their
-- stored provider keys (NULL if the job row is gone).
SELECT k.job_id AS id, k.idempotency_key, k.fingerprint, j.provider_key
FROM {schema}.job_keys k LEFT JOIN {schema}.jobs j ON j.id = k.job_id
WHERE k.idempotency_key = ANY($1::text[])
