-- Key ?1's failure records, open or closed (`Forget::forget_key`); their ids, for their alert
-- marks (purge_alerts.sql).
DELETE FROM redrive_failed_jobs WHERE idempotency_key = ?1
RETURNING CAST(id AS TEXT) AS id
