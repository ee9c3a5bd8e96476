-- Up to ?3 of queue ?1's records whose last failure is before ?2.
DELETE FROM redrive_broker_records
WHERE seq IN (SELECT seq FROM redrive_broker_records WHERE queue = ?1 AND last_failed_at < ?2 ORDER BY seq LIMIT ?3)
