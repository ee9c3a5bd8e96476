-- A deferral or a release: hidden for $3 seconds, its read given back (the next read is not a
-- new attempt), fenced on the read. The token stays: a later read sets its own.
UPDATE pgmq.{queue}
SET vt = clock_timestamp() + make_interval(secs => $3), read_ct = greatest(read_ct - 1, 0)
WHERE msg_id = $1 AND last_read_at = $2
