-- The done alert marks among the keys $1, with the sink each was sent to.
SELECT idempotency_key, result ->> 'sink' AS sink
FROM {schema}.processed_keys
WHERE idempotency_key = ANY($1) AND state = 'done'
