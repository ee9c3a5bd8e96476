-- Take the key: insert it pending with the attempt's provider key, or take over a pending hold
-- that has lapsed (the earlier attempt died), keeping the provider key stored with the key.
-- `fresh` tells which. No row: someone holds it, it is done, or the payload differs.
INSERT INTO {schema}.processed_keys (idempotency_key, fingerprint, state, holder, held_until, provider_key)
VALUES ($1, $2, 'pending', $3, now() + make_interval(secs => $4), $5)
ON CONFLICT (idempotency_key) DO UPDATE
SET holder = excluded.holder, held_until = excluded.held_until, updated_at = now(),
    provider_key = coalesce(processed_keys.provider_key, excluded.provider_key)
WHERE processed_keys.state = 'pending'
  AND processed_keys.held_until <= now()
  AND processed_keys.fingerprint = excluded.fingerprint
RETURNING (xmax = 0) AS fresh, provider_key
