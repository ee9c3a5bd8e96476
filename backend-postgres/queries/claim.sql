-- Take up to $1 ready jobs that no other worker holds, counting an attempt on each, under a fresh
-- lease token that fences every later call about the job. The rows are found by the ready index
-- and updated by primary key (`= ANY`), so the plan stays index-driven whatever the statistics.
WITH picked AS (
    SELECT id FROM {schema}.jobs
    WHERE run_at <= now()
    ORDER BY run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET status = 'running',
    run_at = NULL,
    attempts = j.attempts + 1,
    claims = j.claims + 1,
    lease_token = gen_random_uuid(),
    locked_until = now() + make_interval(secs => $2),
    updated_at = now()
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.id, j.kind, j.idempotency_key, j.provider_key, j.payload, j.attempts, j.claims, j.cap, j.severity,
          j.created_at, j.lease_token
