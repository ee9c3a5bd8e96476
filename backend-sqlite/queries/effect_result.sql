SELECT applied_at FROM redrive_applied_effects WHERE idempotency_key = ?1
