-- Pauses kind $1 with reason $2 by $3, a breaker's probe $4 s from now (NULL: a person's pause),
-- and writes its event, unless it is paused already: the first pause stands, except that a
-- person's pause takes over a breaker's (its probe would otherwise resume the kind). No row:
-- paused already.
WITH paused AS (
    INSERT INTO {schema}.flow_kinds AS k (kind, paused_reason, paused_by, paused_at, probe_at)
    VALUES ($1, $2, $3, now(), now() + make_interval(secs => $4::float8))
    ON CONFLICT (kind) DO UPDATE
    SET paused_reason = excluded.paused_reason, paused_by = excluded.paused_by,
        paused_at = excluded.paused_at, probe_at = excluded.probe_at
    WHERE k.paused_at IS NULL OR (k.probe_at IS NOT NULL AND $4::float8 IS NULL)
    RETURNING kind, paused_by, paused_reason
)
INSERT INTO {schema}.flow_events (kind, action, by, detail)
SELECT kind, 'paused', paused_by, paused_reason FROM paused
RETURNING 1
