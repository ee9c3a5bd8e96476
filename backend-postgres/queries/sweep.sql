-- Return jobs whose lease expired (their worker died or stalled) to queued. Each row is re-checked
-- under its lock against the state and token read, so a job completed in the meantime is left
-- alone. The horizon is the database's clock, not the worker's.
WITH expired AS (
    SELECT id, lease_token FROM {schema}.jobs
    WHERE locked_until < now()
    ORDER BY locked_until
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET status = 'queued', run_at = now(), lease_token = NULL, locked_until = NULL, updated_at = now(),
    last_error = 'lease expired: the worker stopped without settling the job'
FROM expired e
WHERE j.id = e.id AND j.lease_token = e.lease_token AND j.status = 'running'
RETURNING j.id
