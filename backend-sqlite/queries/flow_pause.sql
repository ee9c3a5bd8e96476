-- Pauses kind ?1 with reason ?2 by ?3 at ?4, a breaker's probe at ?5 (NULL: a person's pause),
-- unless it is paused already: the first pause stands, except that a person's pause takes over a
-- breaker's (its probe would otherwise resume the kind). No row: paused already.
INSERT INTO redrive_flow_kinds (kind, paused_reason, paused_by, paused_at, probe_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (kind) DO UPDATE
SET paused_reason = excluded.paused_reason, paused_by = excluded.paused_by,
    paused_at = excluded.paused_at, probe_at = excluded.probe_at
WHERE paused_at IS NULL OR (probe_at IS NOT NULL AND ?5 IS NULL)
RETURNING 1
