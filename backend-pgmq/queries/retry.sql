-- The message hidden for $3 seconds with its error history in its headers, fenced on the read.
UPDATE pgmq.{queue}
SET vt = clock_timestamp() + make_interval(secs => $3), headers = $4::jsonb
WHERE msg_id = $1 AND last_read_at = $2
