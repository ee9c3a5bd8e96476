-- A renewal's part of the ledger: the hold of key $1 under holder $2 extended by $3 seconds, and
-- the key's state as it stands (`cancelled`: a person asked the running handler to stop; `kept`
-- false while pending: another attempt took the key over).
WITH kept AS (
    UPDATE {schema}.processed_keys
    SET held_until = now() + make_interval(secs => $3), updated_at = now()
    WHERE idempotency_key = $1 AND holder = $2 AND state = 'pending'
    RETURNING 1
)
SELECT state, EXISTS (SELECT 1 FROM kept) AS kept FROM {schema}.processed_keys WHERE idempotency_key = $1
