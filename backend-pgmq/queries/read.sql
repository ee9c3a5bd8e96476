-- pgmq's read (`pgmq.read`'s own statement), with the kinds this worker handles: up to $2
-- visible messages, oldest first, hidden for $1 seconds, each read counted. $3: the kinds, or
-- NULL for any; a message without a kind (not an envelope) is any worker's, to be recorded. The
-- lease's token is the read's time (`last_read_at`, set by this read alone), so that a
-- settlement can be fenced on it.
WITH cte AS (
    SELECT msg_id
    FROM pgmq.{queue}
    WHERE vt <= clock_timestamp()
      AND ($3::text[] IS NULL OR message ->> 'kind' IS NULL OR message ->> 'kind' = ANY ($3))
    ORDER BY msg_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE pgmq.{queue} m
SET last_read_at = clock_timestamp(), vt = clock_timestamp() + make_interval(secs => $1), read_ct = m.read_ct + 1
FROM cte
WHERE m.msg_id = cte.msg_id
RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.message::text AS message, m.headers::text AS headers
