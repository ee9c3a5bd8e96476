-- Serializes the writers of one queue's records for the transaction (see keep_records).
SELECT pg_advisory_xact_lock(hashtext('redrive_broker_records:' || $1))
