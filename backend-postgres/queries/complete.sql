-- Mark jobs done with their results, each fenced by its lease token. The token stays on the done
-- row so that repeating this statement (after a lost connection) is recognised as already applied.
UPDATE {schema}.jobs j
SET status = 'done', result = u.result, locked_until = NULL, updated_at = now()
FROM unnest($1::bigint[], $2::uuid[], $3::jsonb[]) AS u(id, token, result)
WHERE j.id = u.id AND j.lease_token = u.token AND j.status IN ('running', 'done')
RETURNING j.id
