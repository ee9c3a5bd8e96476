-- Close the record and reset its existing job row (a fresh insert with the same key would only be
-- skipped), in one statement: both happen or neither does. A person asked for it to run: its
-- deadline, if it had one, no longer applies. $2: why, $3: who.
WITH record AS (
    UPDATE {schema}.failed_jobs
    SET state = 'replayed', closed_at = now(), replay_reason = $2, replayed_by = $3
    WHERE id = $1 AND state = 'open'
    RETURNING job_id
)
UPDATE {schema}.jobs
SET status = 'queued', attempts = 0, stranded = 0, run_at = now(), errors = '[]', last_error = NULL,
    lease_token = NULL, locked_until = NULL, updated_at = now(), deadline = NULL
WHERE id = (SELECT job_id FROM record) AND status = 'failed'
RETURNING id
