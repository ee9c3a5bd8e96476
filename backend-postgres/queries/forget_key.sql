-- Forgets key $1 entirely (`Forget::forget_key`), as purge.sql forgets an old record, whatever the
-- state: its job and the key's row (a pgmq queue's in `broker_keys` too), its failure records (a
-- broker's kept here too) with their alert marks, its ledger entry and same-database effect.
-- Nothing while a job of the key runs (`running`): its worker would settle nothing. The job is
-- found through its key row.
WITH job AS (
    SELECT job_id AS id FROM {schema}.job_keys WHERE idempotency_key = $1
), running AS (
    SELECT EXISTS (
        SELECT 1 FROM {schema}.jobs WHERE id = (SELECT id FROM job) AND status = 'running'
    ) AS yes
), records AS (
    DELETE FROM {schema}.failed_jobs
    WHERE job_id = (SELECT id FROM job) AND NOT (SELECT yes FROM running)
    RETURNING id::text AS id
), broker AS (
    DELETE FROM {schema}.broker_records
    WHERE idempotency_key = $1 AND NOT (SELECT yes FROM running)
    RETURNING id
), jobs AS (
    DELETE FROM {schema}.jobs WHERE id = (SELECT id FROM job) AND NOT (SELECT yes FROM running)
    RETURNING id
), key_row AS (
    DELETE FROM {schema}.job_keys WHERE idempotency_key = $1 AND NOT (SELECT yes FROM running)
), broker_key AS (
    -- A queue of this database that keeps its keys here (pgmq): the key is free there too.
    DELETE FROM {schema}.broker_keys WHERE idempotency_key = $1 AND NOT (SELECT yes FROM running)
), ledger AS (
    -- The key, and its records' alert keys (sinks 0 to 15, reminders 1 to 16: see purge.sql),
    -- named whole so that they are found by the primary key.
    DELETE FROM {schema}.processed_keys
    WHERE NOT (SELECT yes FROM running) AND idempotency_key = ANY(ARRAY(
        SELECT $1::text
        UNION ALL
        SELECT 'redrive_alert:record=' || r.id || ':sink=' || sink
        FROM (SELECT id FROM records UNION ALL SELECT id FROM broker) r, generate_series(0, 15) sink
        UNION ALL
        SELECT 'redrive_alert:record=' || r.id || ':reminder=' || n || ':sink=' || sink
        FROM (SELECT id FROM records UNION ALL SELECT id FROM broker) r, generate_series(1, 16) n,
             generate_series(0, 15) sink
    ))
    RETURNING 1
), effect AS (
    DELETE FROM {schema}.applied_effects WHERE idempotency_key = $1 AND NOT (SELECT yes FROM running)
    RETURNING 1
)
SELECT (SELECT yes FROM running) AS running,
       (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM records) + (SELECT count(*) FROM broker) AS records,
       (SELECT count(*) FROM ledger) + (SELECT count(*) FROM effect) AS ledger
