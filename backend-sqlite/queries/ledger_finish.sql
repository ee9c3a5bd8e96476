-- Done with result ?2 at ?3. Idempotent: a key done stays as it was.
UPDATE redrive_processed_keys SET result = ?2, done_at = ?3, token = NULL, held_until = NULL
WHERE idempotency_key = ?1 AND done_at IS NULL
