-- Job $1, or the job of key $2 (found through its key row): the columns `list_jobs` reads.
SELECT id, kind, idempotency_key, payload, attempts, cap, errors, run_at, locked_until, created_at, updated_at,
       cancelled_at, cancel_reason, cancelled_by, cancel_requested_at,
       CASE WHEN run_at > now() THEN 'scheduled'
            WHEN status = 'done' AND cancelled_at IS NOT NULL THEN 'cancelled'
            ELSE status END AS state
FROM {schema}.jobs
WHERE id = coalesce($1, (SELECT job_id FROM {schema}.job_keys WHERE idempotency_key = $2))
