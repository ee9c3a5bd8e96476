-- A record's stored state: ?1 queue, ?2 id.
SELECT state, closed FROM redrive_broker_records WHERE queue = ?1 AND id = ?2
