-- Delete up to $2 jobs that finished (done) more than $1 seconds ago, oldest first, with their
-- keys, so the tables do not grow forever. A pruned key no longer dedupes: enqueued again, it makes
-- a new job. Rows another statement holds are left for the next call. The old rows are found by
-- the done index, and both deletes go by primary key (`= ANY`), so none of it can turn into a scan
-- of a table.
WITH old AS MATERIALIZED (
    SELECT id FROM {schema}.jobs
    WHERE status = 'done' AND updated_at < now() - make_interval(secs => $1)
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs WHERE id = ANY(ARRAY(SELECT id FROM old)) RETURNING idempotency_key
)
DELETE FROM {schema}.job_keys WHERE idempotency_key = ANY(ARRAY(SELECT idempotency_key FROM gone))
