SELECT fingerprint, provider_key, token, held_until, result, done_at
FROM redrive_processed_keys WHERE idempotency_key = ?1
