-- A settlement other than completion ends the claim's hold of key $1 (holder $2): the next
-- attempt takes the key at once.
UPDATE {schema}.processed_keys
SET held_until = now(), updated_at = now()
WHERE idempotency_key = $1 AND holder = $2 AND state = 'pending'
