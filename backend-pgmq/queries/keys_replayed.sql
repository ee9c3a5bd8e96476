-- A replay's message, sent under the key it failed with: the key now answers for it (or holds it
-- again, if the key was forgotten or the message came from another client). The fingerprint is
-- the replayed job's.
INSERT INTO {schema}.broker_keys (queue, idempotency_key, fingerprint, provider_key, job_id)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (queue, idempotency_key) DO UPDATE SET job_id = excluded.job_id, fingerprint = excluded.fingerprint
