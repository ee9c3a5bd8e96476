-- Delete up to $2 jobs that finished (done) more than $1 seconds ago, with their keys, so the
-- tables do not grow forever. A pruned key no longer dedupes: enqueued again, it makes a new job.
-- Rows another statement holds are left for the next call.
WITH old AS (
    SELECT id, idempotency_key FROM {schema}.jobs
    WHERE status = 'done' AND updated_at < now() - make_interval(secs => $1)
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs j USING old WHERE j.id = old.id RETURNING j.idempotency_key
)
DELETE FROM {schema}.job_keys k USING gone WHERE k.idempotency_key = gone.idempotency_key
