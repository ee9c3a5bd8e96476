INSERT INTO redrive_applied_effects (idempotency_key, applied_at) VALUES (?1, ?2)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING 1
