-- Cancels key ?1 at ?2 (ms), keeping why (?3) and who (?4): a pending key (held or not), or a new
-- one with no payload seen yet (no fingerprint) and the provider key ?5.
INSERT INTO redrive_processed_keys (idempotency_key, fingerprint, provider_key, cancelled_at, cancel_reason, cancelled_by)
VALUES (?1, '', ?5, ?2, ?3, ?4)
ON CONFLICT (idempotency_key) DO UPDATE SET cancelled_at = ?2, cancel_reason = ?3, cancelled_by = ?4
WHERE done_at IS NULL AND cancelled_at IS NULL
RETURNING idempotency_key
