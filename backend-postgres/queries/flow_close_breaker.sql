-- Ends kind $1's pause if a breaker's (its probe time set), and writes its event by $2 (the
-- breaker); a person's pause stays. No row: no breaker's pause.
WITH closed AS (
    UPDATE {schema}.flow_kinds
    SET paused_reason = NULL, paused_by = NULL, paused_at = NULL, probe_at = NULL
    WHERE kind = $1 AND probe_at IS NOT NULL
    RETURNING kind
)
INSERT INTO {schema}.flow_events (kind, action, by, detail)
SELECT kind, 'resumed', $2, 'a probe succeeded' FROM closed
RETURNING 1
