-- Takes the probe of kind $1's breaker pause if it is due, moving the next one $2 s on. The row
-- lock makes a second taker of the same probe time see the moved time, and find none.
UPDATE {schema}.flow_kinds
SET probe_at = now() + make_interval(secs => $2)
WHERE kind = $1 AND probe_at <= now()
RETURNING 1
