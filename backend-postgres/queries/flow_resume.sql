-- Resumes kind $1 by $2 and writes its event, saying whose pause ended. No row: not paused. The
-- locked read gives the pause as it is when the lock is had, so of two resumes one answers.
WITH was AS (
    SELECT kind, paused_by, paused_at FROM {schema}.flow_kinds
    WHERE kind = $1 AND paused_at IS NOT NULL
    FOR UPDATE
), resumed AS (
    UPDATE {schema}.flow_kinds k
    SET paused_reason = NULL, paused_by = NULL, paused_at = NULL, probe_at = NULL
    FROM was
    WHERE k.kind = was.kind
    RETURNING was.kind, was.paused_by, was.paused_at
)
INSERT INTO {schema}.flow_events (kind, action, by, detail)
SELECT kind, 'resumed', $2,
       'paused by ' || paused_by || ' since '
           || to_char(paused_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
FROM resumed
RETURNING 1
