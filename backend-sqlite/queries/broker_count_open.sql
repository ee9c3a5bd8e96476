-- ?1 queue, ?2 now (ms).
SELECT count(*) FROM redrive_broker_records
WHERE queue = ?1 AND (state = 'open' OR (state = 'taken' AND replay_until < ?2))
