-- ?3: the new state's name, ?4 the state as JSON; ?5: whether a replay closes it or gives it back
-- (from taken, whatever its window); ?6 now (ms).
UPDATE redrive_broker_records
SET state = ?3, closed = ?4, replay_until = NULL
WHERE queue = ?1 AND id = ?2
  AND ((state = 'open' OR (state = 'taken' AND replay_until < ?6)) OR (?5 AND state = 'taken'))
RETURNING seq
