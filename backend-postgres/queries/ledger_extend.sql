UPDATE {schema}.processed_keys
SET held_until = now() + make_interval(secs => $3), updated_at = now()
WHERE idempotency_key = $1 AND holder = $2 AND state = 'pending'
RETURNING 1
