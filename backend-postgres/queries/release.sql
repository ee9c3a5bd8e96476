-- Give back a job at no attempt's cost, ready after $3 seconds: claimed ahead and not run
-- (shutdown, a long wait in the buffer), deferred (another attempt holds its key, the effect
-- ledger is down), or interrupted by shutdown's grace. The attempt is undone, and the claim too
-- where the handler never started; one that started keeps its claim, so the next attempt knows
-- it resumes. Nothing is written to the job's error history, so no number of these leads to a
-- failure record. A job a person cancelled while it ran ends cancelled instead.
WITH settled AS (
    UPDATE {schema}.jobs
    SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'done' END,
        run_at = CASE WHEN cancel_requested_at IS NULL THEN now() + make_interval(secs => $3) END,
        cancelled_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        lease_token = NULL, locked_until = NULL,
        attempts = attempts - 1, claims = claims - CASE WHEN started THEN 0 ELSE 1 END, updated_at = now()
    WHERE id = $1 AND lease_token = $2 AND status = 'running'
    RETURNING id, cancelled_at, cancel_reason, cancelled_by, order_key
), {ended_cancelled}
SELECT id FROM settled, woken
