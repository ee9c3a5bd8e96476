-- Done, if ?2 still holds job ?1. ?3 now.
UPDATE redrive_jobs
SET status = 'done', lease_token = NULL, lease_expires = NULL, errors = '[]', done_at = ?3
WHERE id = ?1 AND lease_token = ?2
RETURNING id
