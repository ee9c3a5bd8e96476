-- pgmq's delete, fenced: only while the message is still this read's (no later read took it).
DELETE FROM pgmq.{queue}
WHERE msg_id = $1 AND last_read_at = $2
