-- Key ?1's same-database effect (`Forget::forget_key`).
DELETE FROM redrive_applied_effects WHERE idempotency_key = ?1
