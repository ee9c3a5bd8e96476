UPDATE {schema}.jobs
SET locked_until = now() + make_interval(secs => $3), updated_at = now()
WHERE id = $1 AND lease_token = $2 AND status = 'running'
RETURNING id
