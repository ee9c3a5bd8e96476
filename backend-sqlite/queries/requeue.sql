-- A replay: job ?1 queued again, attempts from zero, with its keys. ?2 now.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?2, lease_token = NULL, lease_expires = NULL, started = 0,
    attempts = 0, errors = '[]', done_at = NULL
WHERE id = ?1
RETURNING id
