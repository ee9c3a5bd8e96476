-- Whether the lease ($2) of job $1, not renewed, is still held with a cancel asked of the job: a
-- row if so (its worker stops the handler); none if the lease is lost.
SELECT id FROM {schema}.jobs
WHERE id = $1 AND lease_token = $2 AND status = 'running' AND cancel_requested_at IS NOT NULL
