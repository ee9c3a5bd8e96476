-- The jobs of keys a batch did not create, to tell duplicates from key conflicts.
SELECT job_id AS id, idempotency_key, fingerprint FROM {schema}.job_keys WHERE idempotency_key = ANY($1::text[])
