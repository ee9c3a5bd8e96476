-- Who paused kind ?1 and when; no row if it is not paused.
SELECT paused_by, paused_at FROM redrive_flow_kinds WHERE kind = ?1 AND paused_at IS NOT NULL
