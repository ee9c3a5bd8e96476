SELECT id, record, state, closed, replay_until,
       (state = 'open' OR (state = 'replaying' AND replay_until < now())) AS unclosed
FROM {schema}.broker_records
WHERE queue = $1 AND id = $2
