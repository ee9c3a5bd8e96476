-- A fragment, spliced into retry.sql, release.sql and sweep.sql (see `sql.rs`) after a `settled`
-- CTE that returns id, cancelled_at, cancel_reason, cancelled_by and order_key of the jobs it
-- settled.
replay_closed AS (
    -- Cancelled: the record it replays will never be settled by it.
    UPDATE {schema}.failed_jobs f
    SET state = 'discarded', closed_at = s.cancelled_at,
        discard_reason = 'its replayed job was cancelled: ' || s.cancel_reason, discarded_by = s.cancelled_by
    FROM settled s
    WHERE s.cancelled_at IS NOT NULL AND f.state = 'replaying' AND f.job_id = s.id
), woken AS (
    -- Cancelled: a later job of its order key may run now.
    SELECT count(pg_notify('{channel}', '')) AS n FROM settled WHERE cancelled_at IS NOT NULL AND order_key IS NOT NULL
)
