-- One page of records, oldest first. $8 is a LIKE pattern of the error text (`FailureQuery::error_pattern`,
-- its wildcards escaped with `\`), matched without case against the last error.
SELECT * FROM {schema}.failed_jobs
WHERE ($1::text IS NULL OR kind = $1)
  AND ($2::bool IS NULL OR (state = 'open') = $2)
  AND ($3::timestamptz IS NULL OR last_failed_at < $3)
  AND ($6::text IS NULL OR idempotency_key = $6)
  AND ($7::bigint IS NULL OR job_id = $7)
  AND ($8::text IS NULL OR last_error ILIKE $8 ESCAPE '\')
  AND id > $4
ORDER BY id
LIMIT $5
