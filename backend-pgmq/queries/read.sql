-- pgmq's read: up to $3 visible messages, hidden for $2 seconds, each read counted. The lease's
-- token is the read's time (`last_read_at`, set by this read alone), so that a settlement can be
-- fenced on it.
SELECT msg_id, read_ct, enqueued_at, last_read_at, message::text AS message,
       headers::text AS headers
FROM pgmq.read($1, $2, $3)
