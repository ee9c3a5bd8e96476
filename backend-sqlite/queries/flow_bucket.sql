-- Bucket ?1's time, in µs; no row for a bucket never taken from.
SELECT tat FROM redrive_flow_buckets WHERE key = ?1
