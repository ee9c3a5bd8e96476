-- Close the record; its failed job no longer holds the later jobs of its order key back.
WITH record AS (
    UPDATE {schema}.failed_jobs
    SET state = 'discarded', closed_at = now(), discard_reason = $2, discarded_by = $3
    WHERE id = $1 AND state = 'open'
    RETURNING id, job_id
), freed AS (
    UPDATE {schema}.jobs SET order_key = NULL
    WHERE id = (SELECT job_id FROM record) AND status = 'failed' AND order_key IS NOT NULL
    RETURNING id
), woken AS (
    -- The next job of the freed key may run: the workers are told at commit.
    SELECT count(pg_notify('{channel}', '')) AS n FROM freed
)
SELECT id FROM record, woken
