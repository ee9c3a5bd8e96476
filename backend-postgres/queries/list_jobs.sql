-- Live jobs after id $1 by id, at most $6: of kind $2, in state $3, enqueued after $4 and before
-- $5 (each NULL: any). The primary key is read from $1 on, the filters checked on the way: a page
-- reads as many rows as it passes over. A job's state: queued (ready now) or scheduled (ready
-- later), running, done, failed, or cancelled (done unrun, with its audit). The kind comes through
-- `ARRAY(SELECT …)` for the reason the claim's kinds do: given the value, a planner whose
-- statistics do not know the kind expects no row to match, and sorts a scan of the whole table
-- rather than read the primary key in order.
SELECT id, kind, idempotency_key, payload, attempts, cap, errors, run_at, locked_until, created_at, updated_at,
       cancelled_at, cancel_reason, cancelled_by, cancel_requested_at,
       CASE WHEN run_at > now() THEN 'scheduled'
            WHEN status = 'done' AND cancelled_at IS NOT NULL THEN 'cancelled'
            ELSE status END AS state
FROM {schema}.jobs
WHERE id > $1
  AND ($2::text IS NULL OR kind = ANY(ARRAY(SELECT $2::text)))
  AND ($3::text IS NULL OR CASE $3::text
        WHEN 'queued' THEN run_at <= now()
        WHEN 'scheduled' THEN run_at > now()
        WHEN 'done' THEN status = 'done' AND cancelled_at IS NULL
        WHEN 'cancelled' THEN status = 'done' AND cancelled_at IS NOT NULL
        ELSE status = $3 END)
  AND ($4::timestamptz IS NULL OR created_at > (SELECT $4::timestamptz))
  AND ($5::timestamptz IS NULL OR created_at < (SELECT $5::timestamptz))
ORDER BY id
LIMIT $6
