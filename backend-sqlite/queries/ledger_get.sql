SELECT fingerprint, provider_key, token, held_until, result, done_at, cancelled_at, cancel_reason, cancelled_by
FROM redrive_processed_keys WHERE idempotency_key = ?1
