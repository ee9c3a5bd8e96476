-- Done with their results: keys $1 (sorted, so that rows are locked in one order), results $2. A
-- key cancelled while its hold ran is done all the same (completion wins).
UPDATE {schema}.processed_keys p
SET state = 'done', result = f.result, holder = NULL, held_until = NULL, updated_at = now()
FROM unnest($1::text[], $2::jsonb[]) AS f(idempotency_key, result)
WHERE p.idempotency_key = f.idempotency_key AND p.state IN ('pending', 'cancelled')
