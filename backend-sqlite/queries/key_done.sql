-- Whether key ?1's effect is done outside its job row: a same-database effect applied, or a
-- ledger entry done.
SELECT EXISTS (SELECT 1 FROM redrive_applied_effects WHERE idempotency_key = ?1)
    OR EXISTS (SELECT 1 FROM redrive_processed_keys WHERE idempotency_key = ?1 AND done_at IS NOT NULL) AS done
