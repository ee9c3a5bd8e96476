-- Give back a job whose handler never started, ready after $3 seconds: claimed ahead and not run
-- (shutdown, a long wait in the buffer), or deferred (another attempt holds its key, the effect
-- ledger is down). The claim is undone (attempt and claim count), and nothing is written to the
-- job's error history, so no number of these leads to a failure record.
UPDATE {schema}.jobs
SET status = 'queued', run_at = now() + make_interval(secs => $3), lease_token = NULL, locked_until = NULL,
    attempts = attempts - 1, claims = claims - 1, updated_at = now()
WHERE id = $1 AND lease_token = $2 AND status = 'running'
RETURNING id
