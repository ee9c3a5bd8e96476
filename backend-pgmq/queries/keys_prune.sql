-- Keys of queue $1 taken more than $2 seconds ago whose message has left the queue (done, or
-- deleted) and is no failure record's: free again, at most $3 of them per statement.
WITH gone AS (
    SELECT k.idempotency_key
    FROM {schema}.broker_keys k
    WHERE k.queue = $1 AND k.created_at < now() - make_interval(secs => $2)
      AND NOT EXISTS (SELECT 1 FROM pgmq.{queue} m WHERE m.msg_id = k.job_id::bigint)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.broker_records r
          WHERE r.queue = $1 AND r.idempotency_key = k.idempotency_key AND r.job_id = k.job_id)
    LIMIT $3
)
DELETE FROM {schema}.broker_keys k
USING gone
WHERE k.queue = $1 AND k.idempotency_key = gone.idempotency_key
