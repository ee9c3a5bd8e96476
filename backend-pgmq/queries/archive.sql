-- pgmq's archive of one message (moved to its archive table, kept there), in the transaction
-- that holds it.
SELECT pgmq.archive($1, $2::bigint) AS archived
