-- Many jobs in one statement; rows of keys that already exist are skipped.
INSERT INTO {schema}.jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap)
SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::jsonb[], $5::text[], $6::text[], $7::int[])
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key
