-- A replay of record ?3: job ?1 queued again, attempts from zero, with its keys. ?2 now; ?4 the
-- amended payload and ?5 its fingerprint (NULL: as they were). A person asked for it to run: its
-- deadline, if it had one, no longer applies.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?2, lease_token = NULL, lease_expires = NULL, started = 0,
    attempts = 0, errors = '[]', done_at = NULL, deadline = NULL, replay_of = ?3,
    cancel_requested_at = NULL, cancel_reason = NULL, cancelled_by = NULL,
    payload = coalesce(?4, payload), fingerprint = coalesce(?5, fingerprint)
WHERE id = ?1 AND (?4 IS NULL OR status = 'failed')
RETURNING id
