-- Sets record ?2 of queue ?1 to state ?3 (its name), ?4 (the state as JSON), closed.
UPDATE redrive_broker_records SET state = ?3, closed = ?4, replay_until = NULL
WHERE queue = ?1 AND id = ?2
