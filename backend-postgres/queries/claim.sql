-- Take up to $1 ready jobs that no other worker holds, counting an attempt on each, under a fresh
-- lease token that fences every later call about the job.
WITH picked AS (
    SELECT id FROM {schema}.jobs
    WHERE status = 'queued' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET status = 'running',
    attempts = j.attempts + 1,
    claims = j.claims + 1,
    lease_token = gen_random_uuid(),
    locked_until = now() + make_interval(secs => $2),
    updated_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.kind, j.idempotency_key, j.provider_key, j.payload, j.attempts, j.claims, j.cap, j.severity,
          j.created_at, j.lease_token
