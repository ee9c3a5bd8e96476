UPDATE redrive_processed_keys SET held_until = ?3
WHERE idempotency_key = ?1 AND token = ?2 AND done_at IS NULL
RETURNING 1
