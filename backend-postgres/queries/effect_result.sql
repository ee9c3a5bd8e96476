SELECT applied_at FROM {schema}.applied_effects WHERE idempotency_key = $1
