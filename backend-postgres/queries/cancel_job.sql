-- Cancels job $1, keeping why ($2) and who ($3). A queued job (ready or scheduled) finishes unrun
-- ('done', no result), so no claim takes it and its key stays taken until it is pruned with the
-- done jobs; a later job of its order key may run now (the workers are told at commit), and the
-- record it replays, replaying, is closed as discarded (its job will never settle it). A running
-- job is asked to stop: its renewal is refused from now on, and its next settlement but a
-- completion ends it cancelled. `requested` says which happened; no row: neither (look again).
WITH cancelled AS (
    UPDATE {schema}.jobs
    SET status = 'done', run_at = NULL, cancelled_at = now(), cancel_reason = $2, cancelled_by = $3,
        updated_at = now()
    WHERE id = $1 AND status = 'queued'
    RETURNING id, kind, idempotency_key, order_key
), asked AS (
    UPDATE {schema}.jobs
    SET cancel_requested_at = now(), cancel_reason = $2, cancelled_by = $3
    WHERE id = $1 AND status = 'running' AND cancel_requested_at IS NULL
    RETURNING id, kind, idempotency_key
), replay_closed AS (
    UPDATE {schema}.failed_jobs
    SET state = 'discarded', closed_at = now(), discard_reason = 'its replayed job was cancelled: ' || $2,
        discarded_by = $3
    WHERE state = 'replaying' AND job_id = (SELECT id FROM cancelled)
), woken AS (
    SELECT count(pg_notify('{channel}', '')) AS n FROM cancelled WHERE order_key IS NOT NULL
)
SELECT id, kind, idempotency_key, false AS requested FROM cancelled, woken
UNION ALL
SELECT id, kind, idempotency_key, true FROM asked
