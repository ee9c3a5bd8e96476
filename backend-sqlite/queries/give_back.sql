-- Queued again at ?3 with the attempt given back (its handler never ran), if ?2 still holds job ?1.
UPDATE redrive_jobs
SET status = 'queued', ready_at = ?3, lease_token = NULL, lease_expires = NULL, started = 0,
    attempts = attempts - 1
WHERE id = ?1 AND lease_token = ?2
RETURNING id
