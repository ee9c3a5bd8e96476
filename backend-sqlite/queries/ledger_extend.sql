-- Holds key ?1 until ?3 if token ?2 holds it and no person cancelled it.
UPDATE redrive_processed_keys SET held_until = ?3
WHERE idempotency_key = ?1 AND token = ?2 AND done_at IS NULL AND cancelled_at IS NULL
RETURNING 1
