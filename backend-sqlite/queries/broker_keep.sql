-- Keeps a record unless its id is kept. ?1 queue, ?2 id, ?3 job id, ?4 kind, ?5 key, ?6 last
-- failed (ms), ?7 the record (JSON).
INSERT INTO redrive_broker_records (queue, id, job_id, kind, idempotency_key, last_failed_at, record)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (queue, id) DO NOTHING
