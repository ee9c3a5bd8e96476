-- Cancels the effect of key $1, keeping why ($2) and who ($3): a new key (no payload seen yet, so
-- no fingerprint), or a pending one, held or not. No row: it is done, or was cancelled before
-- (`ledger_state` says which).
INSERT INTO {schema}.processed_keys (idempotency_key, fingerprint, state, cancelled_at, cancel_reason, cancelled_by)
VALUES ($1, '', 'cancelled', now(), $2, $3)
ON CONFLICT (idempotency_key) DO UPDATE
SET state = 'cancelled', cancelled_at = now(), cancel_reason = $2, cancelled_by = $3, updated_at = now()
WHERE processed_keys.state = 'pending'
RETURNING idempotency_key
