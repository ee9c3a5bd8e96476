-- One page of records, oldest first. ?1 after id, ?2 kind, ?3 key, ?4 job id, ?5 open (1, 0 or
-- NULL), ?6 failed before, ?7 limit, ?8 a LIKE pattern of the error text (`FailureQuery::error_pattern`,
-- its wildcards escaped with `\`; LIKE folds ASCII case) matched against the last error.
SELECT * FROM redrive_failed_jobs
WHERE id > ?1
  AND (?2 IS NULL OR kind = ?2)
  AND (?3 IS NULL OR idempotency_key = ?3)
  AND (?4 IS NULL OR job_id = ?4)
  AND (?5 IS NULL OR (state = 'open') = ?5)
  AND (?6 IS NULL OR last_failed_at < ?6)
  AND (?8 IS NULL OR last_error LIKE ?8 ESCAPE '\')
ORDER BY id
LIMIT ?7
