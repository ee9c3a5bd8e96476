-- Archived messages older than $1 seconds, deleted with the records a purge of that age removes;
-- with them the keys of queue $2 whose message is a record that goes and that has no younger
-- record: a key whose job failed is free again once its record is purged (as on Postgres).
WITH freed AS (
    DELETE FROM {schema}.broker_keys k
    WHERE k.queue = $2
      AND EXISTS (
          SELECT 1 FROM {schema}.broker_records r
          WHERE r.queue = $2 AND r.idempotency_key = k.idempotency_key AND r.job_id = k.job_id
            AND r.last_failed_at < now() - make_interval(secs => $1))
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.broker_records r
          WHERE r.queue = $2 AND r.idempotency_key = k.idempotency_key
            AND r.last_failed_at >= now() - make_interval(secs => $1))
)
DELETE FROM pgmq.{archive} WHERE archived_at < now() - make_interval(secs => $1)
