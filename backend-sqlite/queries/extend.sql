-- Holds job ?1 until ?3 and marks its handler started, if ?2 still holds it.
UPDATE redrive_jobs SET lease_expires = ?3, started = 1
WHERE id = ?1 AND lease_token = ?2
RETURNING id
