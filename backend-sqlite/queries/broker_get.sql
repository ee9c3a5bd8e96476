-- ?1 queue, ?2 id, ?3 now (ms).
SELECT seq, record, state, closed,
       (state = 'open' OR (state = 'taken' AND replay_until < ?3)) AS unclosed
FROM redrive_broker_records
WHERE queue = ?1 AND id = ?2
