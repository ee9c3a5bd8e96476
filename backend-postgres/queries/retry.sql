-- Back to queued after a delay, keeping the error in the run's history, fenced by the lease token.
-- A job a person cancelled while it ran ends cancelled instead (as `cancel_job.sql` ends a queued
-- one), the error kept.
WITH settled AS (
    UPDATE {schema}.jobs
    SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'done' END,
        run_at = CASE WHEN cancel_requested_at IS NULL THEN now() + make_interval(secs => $3) END,
        cancelled_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        last_error = $4,
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts, 'at', now(), 'error', $4::text)),
        lease_token = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE id = $1 AND lease_token = $2 AND status = 'running'
    RETURNING id, cancelled_at, cancel_reason, cancelled_by, order_key
), {ended_cancelled}
SELECT id FROM settled, woken
