-- Key ?1's ledger entry (`Forget::forget_key`).
DELETE FROM redrive_processed_keys WHERE idempotency_key = ?1
