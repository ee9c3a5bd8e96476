-- Inside the caller's transaction: claim the key for a same-database effect. Waits for a
-- concurrent transaction holding the same key; no row means the effect is already applied.
INSERT INTO {schema}.applied_effects (idempotency_key) VALUES ($1)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING 1
