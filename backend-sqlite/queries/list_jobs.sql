-- Live jobs after id ?1 by id, at most ?6: of kind ?2, in state ?3, enqueued after ?4 and before
-- ?5 (ms; each NULL: any), at ?7 (now, ms). The primary key is read from ?1 on, the filters
-- checked on the way. A job's state: queued (ready now) or scheduled (ready later), running,
-- done, failed, or cancelled (done unrun, with its audit).
SELECT id, kind, idempotency_key, payload, attempts, cap, errors, ready_at, lease_expires, created_at, done_at,
       cancelled_at, cancel_reason, cancelled_by, cancel_requested_at,
       CASE WHEN status = 'queued' AND ready_at > ?7 THEN 'scheduled'
            WHEN status = 'done' AND cancelled_at IS NOT NULL THEN 'cancelled'
            ELSE status END AS state
FROM redrive_jobs
WHERE id > ?1
  AND (?2 IS NULL OR kind = ?2)
  AND (?3 IS NULL OR CASE ?3
        WHEN 'queued' THEN status = 'queued' AND ready_at <= ?7
        WHEN 'scheduled' THEN status = 'queued' AND ready_at > ?7
        WHEN 'done' THEN status = 'done' AND cancelled_at IS NULL
        WHEN 'cancelled' THEN status = 'done' AND cancelled_at IS NOT NULL
        ELSE status = ?3 END)
  AND (?4 IS NULL OR created_at > ?4)
  AND (?5 IS NULL OR created_at < ?5)
ORDER BY id
LIMIT ?6
