-- A failure record. ?1 job id, ?2 kind, ?3 key, ?4 provider key, ?5 payload, ?6 last error,
-- ?7 errors (JSON), ?8 attempts, ?9 cap, ?10 severity, ?11 first failed, ?12 last failed, ?13 the
-- record its job replayed (NULL: none), ?14 the trace id it keeps (see `Claim::dead_letter`; NULL: none).
INSERT INTO redrive_failed_jobs (job_id, kind, idempotency_key, provider_key, payload, last_error, errors,
                                 attempts, cap, severity, first_failed_at, last_failed_at, replay_of, trace_id)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
RETURNING id
