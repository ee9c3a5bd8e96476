-- Failed for good, if ?2 still holds job ?1: what the record needs. (RETURNING reads the row as
-- updated: the error history is left in place for it, and a replay clears it.) `replay_of`: the
-- record it replays, which the new record follows. A cancel asked while it ran is spent: the
-- record is what the person sees, and its replay must run.
UPDATE redrive_jobs
SET status = 'failed', lease_token = NULL, lease_expires = NULL,
    cancel_requested_at = NULL, cancel_reason = NULL, cancelled_by = NULL
WHERE id = ?1 AND lease_token = ?2
RETURNING kind, idempotency_key, provider_key, payload, attempts, cap, severity, errors, replay_of
