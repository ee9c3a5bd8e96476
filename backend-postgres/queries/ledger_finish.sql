-- Done with its result; a key cancelled while its hold ran is done all the same (completion wins).
UPDATE {schema}.processed_keys
SET state = 'done', result = $2, holder = NULL, held_until = NULL, updated_at = now()
WHERE idempotency_key = $1 AND state IN ('pending', 'cancelled')
