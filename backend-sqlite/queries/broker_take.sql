-- Takes an unclosed record for a replay until ?3 (ms); no row if it is closed or taken. Until the
-- window lapses, other readers see it replaying since ?4 (?5: that state as JSON). ?1 queue, ?2 id.
UPDATE redrive_broker_records
SET state = 'taken', replay_until = ?3, closed = ?5
WHERE queue = ?1 AND id = ?2
  AND (state = 'open' OR (state = 'taken' AND replay_until < ?4))
RETURNING seq, record, state, closed, 1 AS unclosed
