-- The job a key already has. ?1 key.
SELECT id, fingerprint, provider_key, status FROM redrive_jobs WHERE idempotency_key = ?1
