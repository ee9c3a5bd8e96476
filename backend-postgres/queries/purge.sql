-- Delete failure records whose last failure is older than $1 seconds, and with them, once a job
-- has no record left, the failed job row and its key: the payload is then nowhere in the schema,
-- and the key is free (enqueued again, it makes a new job). Returns the records deleted.
WITH purged AS (
    DELETE FROM {schema}.failed_jobs
    WHERE last_failed_at < now() - make_interval(secs => $1)
    RETURNING id, job_id
), gone AS (
    -- Every statement of this one sees the records as they were before it: a record that stays
    -- is one this statement does not delete.
    DELETE FROM {schema}.jobs j
    WHERE j.id = ANY(ARRAY(SELECT DISTINCT job_id FROM purged)) AND j.status = 'failed'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.failed_jobs f
          WHERE f.job_id = j.id AND f.last_failed_at >= now() - make_interval(secs => $1)
      )
    RETURNING j.idempotency_key
), keys AS (
    DELETE FROM {schema}.job_keys WHERE idempotency_key = ANY(ARRAY(SELECT idempotency_key FROM gone))
), alerts AS (
    -- The records' alert keys (`redrive_alert:record=<id>:sink=<n>`, sinks 0 to 15, and their
    -- reminders `…:reminder=<r>:sink=<n>`, 1 to 16), which `prune_done` keeps: named whole, so
    -- they are found by the primary key.
    DELETE FROM {schema}.processed_keys
    WHERE idempotency_key = ANY(ARRAY(
        SELECT 'redrive_alert:record=' || p.id || ':sink=' || sink FROM purged p, generate_series(0, 15) sink
        UNION ALL
        SELECT 'redrive_alert:record=' || p.id || ':reminder=' || r || ':sink=' || sink
        FROM purged p, generate_series(1, 16) r, generate_series(0, 15) sink
    ))
)
SELECT count(*) AS purged FROM purged
