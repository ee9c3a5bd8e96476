-- Queued again at ?3 with the attempt given back (its handler never ran), if ?2 still holds job
-- ?1. ?4 now (ms). A job a person cancelled while it ran ends cancelled instead (`cancelled_at`
-- set: its replayed record is closed next, in the same transaction).
UPDATE redrive_jobs
SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'done' END,
    ready_at = CASE WHEN cancel_requested_at IS NULL THEN ?3 END,
    done_at = CASE WHEN cancel_requested_at IS NOT NULL THEN ?4 END,
    cancelled_at = CASE WHEN cancel_requested_at IS NOT NULL THEN ?4 END,
    lease_token = NULL, lease_expires = NULL, started = 0,
    attempts = attempts - 1
WHERE id = ?1 AND lease_token = ?2
RETURNING id, cancelled_at, cancel_reason, cancelled_by, order_key
