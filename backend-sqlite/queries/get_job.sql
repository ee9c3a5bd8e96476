-- Job ?1, or the job of key ?2 (by its unique index), at ?3 (now, ms): the columns `list_jobs`
-- reads.
SELECT id, kind, idempotency_key, payload, attempts, cap, errors, ready_at, lease_expires, created_at, done_at,
       cancelled_at, cancel_reason, cancelled_by, cancel_requested_at,
       CASE WHEN status = 'queued' AND ready_at > ?3 THEN 'scheduled'
            WHEN status = 'done' AND cancelled_at IS NOT NULL THEN 'cancelled'
            ELSE status END AS state
FROM redrive_jobs
WHERE id = ?1 OR idempotency_key = ?2
