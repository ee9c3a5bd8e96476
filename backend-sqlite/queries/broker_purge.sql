DELETE FROM redrive_broker_records WHERE queue = ?1 AND last_failed_at < ?2
