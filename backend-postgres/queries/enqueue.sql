-- Insert-or-skip on the key. Returns the new row (created = true), or else the existing row with
-- its fingerprint so the caller can tell a duplicate from a key conflict.
WITH inserted AS (
    INSERT INTO {schema}.jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, fingerprint
)
SELECT id, fingerprint, true AS created FROM inserted
UNION ALL
SELECT id, fingerprint, false FROM {schema}.jobs
WHERE idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
