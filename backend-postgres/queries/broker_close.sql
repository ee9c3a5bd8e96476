-- $3: the new state; $4: whether a replay closes it or gives it back (from taken, whatever its
-- window).
UPDATE {schema}.broker_records
SET state = $3::jsonb ->> 'state', closed = $3, replay_until = NULL
WHERE queue = $1 AND id = $2
  AND (state = 'open' OR (state = 'replaying' AND ($4 OR replay_until < now())))
RETURNING id
