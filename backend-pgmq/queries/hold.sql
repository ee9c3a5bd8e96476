-- The message locked while its failure record is written, if it is still this read's: no read
-- takes it meanwhile (pgmq's read skips locked rows).
SELECT msg_id FROM pgmq.{queue}
WHERE msg_id = $1 AND last_read_at = $2
FOR UPDATE
