-- Takes the probe of kind ?1's breaker pause if it is due at ?2, moving the next one to ?3.
UPDATE redrive_flow_kinds SET probe_at = ?3
WHERE kind = ?1 AND probe_at <= ?2
RETURNING 1
