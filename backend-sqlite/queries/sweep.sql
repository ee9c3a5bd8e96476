-- Jobs whose lease lapsed go back to the queue. A claim whose handler never started (no renewal)
-- gives its attempt back and counts as stranded. ?1 now.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?1, lease_token = NULL, lease_expires = NULL,
    attempts = attempts - (1 - started), stranded = stranded + (1 - started), started = 0
WHERE status = 'running' AND lease_expires <= ?1
