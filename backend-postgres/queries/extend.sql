-- Renew a lease: the heartbeat, and the move of a started job from its claim lease to the full
-- lease, which marks it started (a lapse after this charges the attempt). `updated_at` stays the
-- claim's time: what a running job's "since" reads. With $4 (a handler's renewal, not a
-- settlement's), a job a person cancelled is not renewed (`cancel_asked` then tells the worker
-- why).
UPDATE {schema}.jobs
SET locked_until = now() + make_interval(secs => $3), started = true
WHERE id = $1 AND lease_token = $2 AND status = 'running' AND (NOT $4 OR cancel_requested_at IS NULL)
RETURNING id
