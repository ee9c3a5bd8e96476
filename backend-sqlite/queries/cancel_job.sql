-- Cancels job ?1 if it is queued (ready or scheduled), at ?2 (ms), keeping why (?3) and who (?4):
-- it finishes unrun ('done'), so no claim takes it, a later job of its order key may run, and its
-- key stays taken until it is pruned with the done jobs.
UPDATE redrive_jobs
SET status = 'done', ready_at = NULL, done_at = ?2, cancelled_at = ?2, cancel_reason = ?3, cancelled_by = ?4
WHERE id = ?1 AND status = 'queued'
RETURNING kind, idempotency_key, order_key
