-- One page, in insertion order. A replay whose window lapsed unconfirmed reads as open. ?1 queue,
-- ?2 kind, ?3 open (1, 0 or NULL), ?4 failed before (ms), ?5 key, ?6 job id, ?7 after seq,
-- ?8 limit, ?9 now (ms), ?10 a LIKE pattern of the error text (see list_failures.sql).
SELECT seq, record, state, closed,
       (state = 'open' OR (state = 'taken' AND replay_until < ?9)) AS unclosed
FROM redrive_broker_records
WHERE queue = ?1
  AND (?2 IS NULL OR kind = ?2)
  AND (?3 IS NULL OR (state = 'open' OR (state = 'taken' AND replay_until < ?9)) = ?3)
  AND (?4 IS NULL OR last_failed_at < ?4)
  AND (?5 IS NULL OR idempotency_key = ?5)
  AND (?6 IS NULL OR job_id = ?6)
  AND (?10 IS NULL OR json_extract(record, '$.last_error') LIKE ?10 ESCAPE '\')
  AND seq > ?7
ORDER BY seq
LIMIT ?8
