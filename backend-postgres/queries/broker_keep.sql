-- $2..$7 are arrays, one element per record.
INSERT INTO {schema}.broker_records (queue, id, job_id, kind, idempotency_key, last_failed_at, record)
SELECT $1, r.id, r.job_id, r.kind, r.key, r.at, r.record::json
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[])
    AS r(id, job_id, kind, key, at, record)
ON CONFLICT (queue, id) DO NOTHING
