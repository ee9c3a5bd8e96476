-- Up to ?2 same-database effect keys applied before ?1.
DELETE FROM redrive_applied_effects
WHERE idempotency_key IN (
    SELECT idempotency_key FROM redrive_applied_effects WHERE applied_at < ?1 ORDER BY applied_at LIMIT ?2
)
