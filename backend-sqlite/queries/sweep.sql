-- Jobs whose lease lapsed go back to the queue. A claim whose handler never started (no renewal)
-- gives its attempt back and counts as stranded. ?1 now. A job a person cancelled while it ran
-- ends cancelled instead (returned: its replayed record is closed next, in the same transaction).
UPDATE redrive_jobs
SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'done' END,
    ready_at = CASE WHEN cancel_requested_at IS NULL THEN ?1 END,
    done_at = CASE WHEN cancel_requested_at IS NOT NULL THEN ?1 END,
    cancelled_at = CASE WHEN cancel_requested_at IS NOT NULL THEN ?1 END,
    lease_token = NULL, lease_expires = NULL,
    attempts = attempts - (1 - started), stranded = stranded + (1 - started), started = 0
WHERE status = 'running' AND lease_expires <= ?1
RETURNING id, cancelled_at, cancel_reason, cancelled_by, order_key
