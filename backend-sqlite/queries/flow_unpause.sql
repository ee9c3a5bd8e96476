-- Ends kind ?1's pause, a breaker's only where ?2 is true; no row if there was none to end.
UPDATE redrive_flow_kinds
SET paused_reason = NULL, paused_by = NULL, paused_at = NULL, probe_at = NULL
WHERE kind = ?1 AND paused_at IS NOT NULL AND (NOT ?2 OR probe_at IS NOT NULL)
RETURNING 1
