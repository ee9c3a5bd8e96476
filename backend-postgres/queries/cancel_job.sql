-- Cancels job $1 if it is queued (ready or scheduled), keeping why ($2) and who ($3): it finishes
-- unrun ('done', no result), so no claim takes it and its key stays taken until it is pruned with
-- the done jobs. A later job of its order key may run now: the workers are told at commit. A
-- replayed job's record, replaying, is closed as discarded with the cancel's why and who: its
-- job will never settle it.
WITH cancelled AS (
    UPDATE {schema}.jobs
    SET status = 'done', run_at = NULL, cancelled_at = now(), cancel_reason = $2, cancelled_by = $3,
        updated_at = now()
    WHERE id = $1 AND status = 'queued'
    RETURNING id, kind, idempotency_key, order_key
), replay_closed AS (
    UPDATE {schema}.failed_jobs
    SET state = 'discarded', closed_at = now(), discard_reason = 'its replayed job was cancelled: ' || $2,
        discarded_by = $3
    WHERE state = 'replaying' AND job_id = (SELECT id FROM cancelled)
), woken AS (
    SELECT count(pg_notify('{channel}', '')) AS n FROM cancelled WHERE order_key IS NOT NULL
)
SELECT id, kind, idempotency_key FROM cancelled, woken
