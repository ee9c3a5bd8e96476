-- Return jobs whose lease expired (their worker died or stalled) to queued. The rows are found by
-- the lease index and updated by primary key (`= ANY`), never by a join whose plan could become a
-- scan of the table. Each row is locked as it is found, and its expiry is checked again on the
-- version that is locked (a job completed or extended meanwhile is left alone: River #1302). The
-- horizon is the database's clock, not the worker's.
--
-- A claim that was never renewed (its worker died with it claimed ahead) gives its attempt back
-- and counts as stranded; one that was renewed keeps it, and its error says why. The claim count
-- stays either way: a handler may have started before its first renewal, so the next attempt is
-- told an earlier one may be pending. A job a person cancelled while it ran ends cancelled.
WITH expired AS MATERIALIZED (
    SELECT id FROM {schema}.jobs
    WHERE locked_until < now()
    ORDER BY locked_until
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
), settled AS (
    UPDATE {schema}.jobs
    SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'done' END,
        run_at = CASE WHEN cancel_requested_at IS NULL THEN now() END,
        cancelled_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        lease_token = NULL, locked_until = NULL, updated_at = now(),
        attempts = attempts - (NOT started)::int,
        stranded = stranded + (NOT started)::int,
        last_error = CASE WHEN started THEN 'lease expired: the worker stopped without settling the job'
                          ELSE last_error END
    WHERE id = ANY(ARRAY(SELECT id FROM expired)) AND locked_until < now() AND status = 'running'
    RETURNING id, cancelled_at, cancel_reason, cancelled_by, order_key
), {ended_cancelled}
SELECT id FROM settled, woken
