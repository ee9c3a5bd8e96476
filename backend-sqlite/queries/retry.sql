-- Queued again at ?3 with the attempt's error kept, if ?2 still holds job ?1.
-- ?4 the error's time (RFC 3339), ?5 the error.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?3, lease_token = NULL, lease_expires = NULL, started = 0,
    errors = json_insert(errors, '$[#]', json_object('attempt', attempts, 'at', ?4, 'error', ?5))
WHERE id = ?1 AND lease_token = ?2
RETURNING id
