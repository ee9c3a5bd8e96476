SELECT count(*) FROM {schema}.broker_records
WHERE queue = $1 AND (state = 'open' OR (state = 'replaying' AND replay_until < now()))
