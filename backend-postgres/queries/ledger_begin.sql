-- Take keys $1 (distinct, sorted: rows are locked in one order, so two groups cannot deadlock),
-- each with its fingerprint $2, this attempt's token $3, hold seconds $4 and provider key $5:
-- insert it pending, or take over a pending hold that has lapsed (the earlier attempt died),
-- keeping the provider key stored with the key. `fresh` tells which. A key with no row: someone
-- holds it, it is done or cancelled, or the payload differs (read apart, by `ledger_state`).
INSERT INTO {schema}.processed_keys (idempotency_key, fingerprint, state, holder, held_until, provider_key)
SELECT b.idempotency_key, b.fingerprint, 'pending', b.holder, now() + make_interval(secs => b.secs), b.provider_key
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::float8[], $5::uuid[])
     WITH ORDINALITY AS b(idempotency_key, fingerprint, holder, secs, provider_key, n)
ORDER BY b.n
ON CONFLICT (idempotency_key) DO UPDATE
SET holder = excluded.holder, held_until = excluded.held_until, updated_at = now(),
    provider_key = coalesce(processed_keys.provider_key, excluded.provider_key)
WHERE processed_keys.state = 'pending'
  AND processed_keys.held_until <= now()
  AND processed_keys.fingerprint = excluded.fingerprint
RETURNING idempotency_key, (xmax = 0) AS fresh, provider_key
