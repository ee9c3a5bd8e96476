-- A new job, unless its key has one. ?1 kind, ?2 key, ?3 provider key, ?4 payload,
-- ?5 fingerprint, ?6 severity, ?7 cap, ?8 now, ?9 deadline (ms or NULL), ?10 not before (ms or
-- NULL: now), ?11 order key (or NULL), ?12 priority, ?13 the producer's traceparent (or NULL).
INSERT INTO redrive_jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, status, ready_at, created_at, deadline, order_key, priority, traceparent)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', coalesce(?10, ?8), ?8, ?9, ?11, ?12, ?13)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
