-- Reset the record's job row and mark the record replaying (a fresh insert with the same key would
-- only be skipped), in one statement: both happen or neither does. The job's completion confirms
-- the record; its failure links the record to the new one. A person asked for it to run: its
-- deadline, if it had one, no longer applies. $2: why, $3: who, $4: the amended payload (NULL: the
-- record's own), $5: its fingerprint (NULL: the key's stays).
WITH record AS (
    UPDATE {schema}.failed_jobs
    SET state = 'replaying', closed_at = now(), replay_reason = $2, replayed_by = $3, amended = $4
    WHERE id = $1 AND state = 'open'
    RETURNING job_id, idempotency_key
), amended_key AS (
    UPDATE {schema}.job_keys SET fingerprint = $5
    WHERE $5::text IS NOT NULL AND idempotency_key = (SELECT idempotency_key FROM record)
)
UPDATE {schema}.jobs
SET status = 'queued', attempts = 0, stranded = 0, run_at = now(), errors = '[]', last_error = NULL,
    lease_token = NULL, locked_until = NULL, updated_at = now(), deadline = NULL,
    payload = coalesce($4, payload)
WHERE id = (SELECT job_id FROM record) AND status = 'failed'
RETURNING id
