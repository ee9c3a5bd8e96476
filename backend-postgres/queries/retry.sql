-- Back to queued after a delay, keeping the error in the run's history, fenced by the lease token.
UPDATE {schema}.jobs
SET status = 'queued',
    run_at = now() + make_interval(secs => $3),
    last_error = $4,
    errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts, 'at', now(), 'error', $4::text)),
    lease_token = NULL,
    locked_until = NULL,
    updated_at = now()
WHERE id = $1 AND lease_token = $2 AND status = 'running'
RETURNING id
