SELECT count(*) FROM {schema}.broker_records
WHERE queue = $1 AND {schema}.broker_unclosed(state, replay_until)
