-- Key ?1's failure records of broker queues kept in this file, every queue's
-- (`Forget::forget_key`); their ids, for their alert marks (purge_alerts.sql).
DELETE FROM redrive_broker_records WHERE idempotency_key = ?1
RETURNING id
