-- A replay whose window lapsed unconfirmed reads as open (`unclosed`). $9 is a LIKE pattern of the
-- error text (see list_failures.sql), matched without case against the record's last error.
SELECT id, record, state, closed, replay_until,
       {schema}.broker_unclosed(state, replay_until) AS unclosed
FROM {schema}.broker_records
WHERE queue = $1
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::bool IS NULL OR {schema}.broker_unclosed(state, replay_until) = $3)
  AND ($4::timestamptz IS NULL OR last_failed_at < $4)
  AND ($5::text IS NULL OR idempotency_key = $5)
  AND ($6::text IS NULL OR job_id = $6)
  AND ($9::text IS NULL OR record->>'last_error' ILIKE $9 ESCAPE '\')
  AND seq > $7
ORDER BY seq
LIMIT $8
