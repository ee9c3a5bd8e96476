-- A replay: job ?1 queued again, attempts from zero, with its keys. ?2 now. A person asked for it
-- to run: its deadline, if it had one, no longer applies.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?2, lease_token = NULL, lease_expires = NULL, started = 0,
    attempts = 0, errors = '[]', done_at = NULL, deadline = NULL
WHERE id = ?1
RETURNING id
