-- $3: the new state; $4: whether a replay closes it or gives it back (from taken, whatever its
-- window).
UPDATE {schema}.broker_records
SET state = $3::jsonb ->> 'state', closed = $3, replay_until = NULL
WHERE queue = $1 AND id = $2
  AND ({schema}.broker_unclosed(state, replay_until) OR ($4 AND state = 'replaying'))
RETURNING id
