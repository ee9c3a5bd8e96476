-- A later attempt takes a pending key whose hold lapsed. ?1 key, ?2 token, ?3 held until, ?4 now.
UPDATE redrive_processed_keys SET token = ?2, held_until = ?3
WHERE idempotency_key = ?1 AND done_at IS NULL AND held_until <= ?4
RETURNING provider_key
