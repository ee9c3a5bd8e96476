SELECT fingerprint, state, result, cancelled_at, cancel_reason, cancelled_by,
       greatest(extract(epoch FROM held_until - now()), 0)::float8 AS held_for_secs
FROM {schema}.processed_keys WHERE idempotency_key = $1
