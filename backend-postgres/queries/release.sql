-- Give back a job whose handler never started: queued now, and the claim undone (attempt and
-- claim count), so a worker that claimed ahead and could not start it costs the job nothing.
UPDATE {schema}.jobs
SET status = 'queued', run_at = now(), lease_token = NULL, locked_until = NULL,
    attempts = attempts - 1, claims = claims - 1, updated_at = now()
WHERE id = $1 AND lease_token = $2 AND status = 'running'
RETURNING id
