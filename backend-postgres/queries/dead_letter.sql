-- Mark the job failed and write its failure record, in one statement (so one transaction),
-- fenced by the lease token: a stale lease writes nothing.
WITH failed AS (
    UPDATE {schema}.jobs
    SET status = 'failed',
        last_error = $3,
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts, 'at', now(), 'error', $3::text)),
        lease_token = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE id = $1 AND lease_token = $2 AND status = 'running'
    RETURNING *
)
INSERT INTO {schema}.failed_jobs (job_id, kind, idempotency_key, provider_key, payload, severity, last_error,
                                  errors, attempts, cap, first_failed_at)
SELECT id, kind, idempotency_key, provider_key, payload, severity, last_error, errors, attempts, cap,
       coalesce((errors -> 0 ->> 'at')::timestamptz, now())
FROM failed
RETURNING *
