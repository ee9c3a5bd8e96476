-- Takes an unclosed record for a replay of $3 seconds; no row if it is closed or taken. Until
-- the window lapses, other readers see it replaying since now.
UPDATE {schema}.broker_records
SET state = 'taken',
    replay_until = now() + make_interval(secs => $3),
    closed = jsonb_build_object('state', 'replaying', 'at', now())
WHERE queue = $1 AND id = $2
  AND {schema}.broker_unclosed(state, replay_until)
RETURNING id, record, state, closed, replay_until, true AS unclosed
