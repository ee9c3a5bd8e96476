-- pgmq's delete of many finished messages at once, each fenced: only a message still under the
-- read that finished it (no later read took it). The ids and reads deleted.
DELETE FROM pgmq.{queue} m
USING unnest($1::bigint[], $2::timestamptz[]) AS done(msg_id, read_at)
WHERE m.msg_id = done.msg_id AND m.last_read_at = done.read_at
RETURNING m.msg_id, m.last_read_at
