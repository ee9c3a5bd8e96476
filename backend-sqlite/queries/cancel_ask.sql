-- Asks running job ?1 to stop, at ?2 (ms), keeping why (?3) and who (?4): its renewal is refused
-- from now on, and its next settlement but a completion or a failure record ends it cancelled.
UPDATE redrive_jobs SET cancel_requested_at = ?2, cancel_reason = ?3, cancelled_by = ?4
WHERE id = ?1 AND status = 'running' AND cancel_requested_at IS NULL
RETURNING kind, idempotency_key
