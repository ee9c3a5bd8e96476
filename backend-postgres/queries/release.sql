-- Give the job back at once; its attempt stays counted.
UPDATE {schema}.jobs
SET status = 'queued', run_at = now(), lease_token = NULL, locked_until = NULL, updated_at = now()
WHERE id = $1 AND lease_token = $2 AND status = 'running'
RETURNING id
