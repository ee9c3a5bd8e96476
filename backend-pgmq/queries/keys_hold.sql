-- The claim's part of the effect ledger (the records database's `processed_keys`), in the read's
-- transaction: keys $1 (distinct, sorted, so that two claims lock rows in one order), each with
-- its payload's fingerprint $2, this read's holder $3, hold seconds $4 and provider key $5, taken
-- as `Ledger::begin` takes one: inserted pending, or a lapsed pending hold taken over. `fresh`
-- tells which. A key with no row is not taken (held, done, cancelled, or another payload): its
-- worker asks the ledger, which says which.
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
