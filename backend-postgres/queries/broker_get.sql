SELECT id, record, state, closed, replay_until,
       {schema}.broker_unclosed(state, replay_until) AS unclosed
FROM {schema}.broker_records
WHERE queue = $1 AND id = $2
