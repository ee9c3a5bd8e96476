UPDATE {schema}.processed_keys
SET held_until = now(), updated_at = now()
WHERE idempotency_key = $1 AND holder = $2 AND state = 'pending'
