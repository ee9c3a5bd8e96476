-- The messages the new keys of an enqueue sent ($2 keys, $3 message ids), in its transaction.
UPDATE {schema}.broker_keys k SET job_id = sent.job_id
FROM unnest($2::text[], $3::text[]) AS sent(idempotency_key, job_id)
WHERE k.queue = $1 AND k.idempotency_key = sent.idempotency_key
