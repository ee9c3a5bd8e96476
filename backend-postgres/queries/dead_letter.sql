-- Mark the job failed and write its failure record, in one statement (so one transaction),
-- fenced by the lease token: a stale lease writes nothing. A replayed job that fails again links
-- the two records: the new one names the replayed one (`replay_of`), which becomes `failed_again`
-- and names the new one. $4: the trace id the record keeps (see `Claim::dead_letter`), or NULL. A
-- cancel asked while it ran is spent: the record is what the person sees, and its replay must run.
WITH failed AS (
    UPDATE {schema}.jobs
    SET status = 'failed',
        last_error = $3,
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts, 'at', now(), 'error', $3::text)),
        lease_token = NULL,
        locked_until = NULL,
        cancel_requested_at = NULL, cancel_reason = NULL, cancelled_by = NULL,
        updated_at = now()
    WHERE id = $1 AND lease_token = $2 AND status = 'running'
    RETURNING *
), replayed AS (
    SELECT f.id FROM {schema}.failed_jobs f WHERE f.state = 'replaying' AND f.job_id = (SELECT id FROM failed)
), recorded AS (
    INSERT INTO {schema}.failed_jobs (job_id, kind, idempotency_key, provider_key, payload, severity, last_error,
                                      errors, attempts, cap, first_failed_at, replay_of, trace_id)
    SELECT id, kind, idempotency_key, provider_key, payload, severity, last_error, errors, attempts, cap,
           coalesce((errors -> 0 ->> 'at')::timestamptz, now()), (SELECT max(id) FROM replayed), $4
    FROM failed
    RETURNING *
), linked AS (
    UPDATE {schema}.failed_jobs old SET state = 'failed_again', failed_again_at = now(), next_record = recorded.id
    FROM recorded WHERE old.id = recorded.replay_of
)
SELECT * FROM recorded
