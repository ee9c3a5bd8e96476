-- Return jobs whose lease expired (their worker died or stalled) to queued. The rows are found by
-- the lease index and updated by primary key (`= ANY`), never by a join whose plan could become a
-- scan of the table. Each row is locked as it is found, and its expiry is checked again on the
-- version that is locked (a job completed or extended meanwhile is left alone: River #1302). The
-- horizon is the database's clock, not the worker's.
--
-- A claim whose handler never started (its worker died with it claimed ahead) gives its attempt
-- and claim back and counts as stranded; one that started keeps them, and its error says why.
WITH expired AS MATERIALIZED (
    SELECT id FROM {schema}.jobs
    WHERE locked_until < now()
    ORDER BY locked_until
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs
SET status = 'queued', run_at = now(), lease_token = NULL, locked_until = NULL, updated_at = now(),
    attempts = attempts - (NOT started)::int,
    claims = claims - (NOT started)::int,
    stranded = stranded + (NOT started)::int,
    last_error = CASE WHEN started THEN 'lease expired: the worker stopped without settling the job'
                      ELSE last_error END
WHERE id = ANY(ARRAY(SELECT id FROM expired)) AND locked_until < now() AND status = 'running'
RETURNING id
