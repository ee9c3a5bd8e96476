-- pgmq's set_vt, fenced on the read: the lease extended by $3 seconds from now.
UPDATE pgmq.{queue}
SET vt = clock_timestamp() + make_interval(secs => $3)
WHERE msg_id = $1 AND last_read_at = $2
RETURNING msg_id
