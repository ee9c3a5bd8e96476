-- Reset the record's job row (a fresh insert with the same key would only be skipped) and mark the
-- record replaying, in one statement: both happen or neither does, the record locked first so two
-- replays at once put the job back once. The job's completion confirms the record; its failure
-- links the record to the new one. A person asked for it to run: its deadline, if it had one, no
-- longer applies. $2: why, $3: who.
--
-- $4: an amended payload (NULL: the record's own) and $5 its fingerprint, which the key takes in
-- the same statement, so that the amended job is the key's job from then on. Amended only while
-- the key's effect has not happened: the job failed (its row is the key's ledger entry), and no
-- same-database effect or other ledger entry of the key is done.
WITH record AS (
    SELECT job_id FROM {schema}.failed_jobs WHERE id = $1 AND state = 'open' FOR UPDATE
), job AS (
    UPDATE {schema}.jobs
    SET status = 'queued', attempts = 0, stranded = 0, run_at = now(), errors = '[]', last_error = NULL,
        lease_token = NULL, locked_until = NULL, updated_at = now(), deadline = NULL,
        cancel_requested_at = NULL, cancel_reason = NULL, cancelled_by = NULL,
        payload = coalesce($4, payload)
    WHERE id = (SELECT job_id FROM record) AND status = 'failed'
      AND ($4::jsonb IS NULL OR (
          NOT EXISTS (SELECT 1 FROM {schema}.applied_effects e WHERE e.idempotency_key = jobs.idempotency_key)
          AND NOT EXISTS (SELECT 1 FROM {schema}.processed_keys p
                          WHERE p.idempotency_key = jobs.idempotency_key AND p.state = 'done')))
    RETURNING id, idempotency_key
), replaying AS (
    UPDATE {schema}.failed_jobs
    SET state = 'replaying', closed_at = now(), replay_reason = $2, replayed_by = $3, amended = $4
    WHERE id = $1 AND EXISTS (SELECT 1 FROM job)
), amended_key AS (
    UPDATE {schema}.job_keys SET fingerprint = $5
    WHERE $5::text IS NOT NULL AND idempotency_key = (SELECT idempotency_key FROM job)
)
SELECT id FROM job
