SELECT seq FROM redrive_broker_records WHERE queue = ?1 AND id = ?2
