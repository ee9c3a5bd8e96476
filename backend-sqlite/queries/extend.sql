-- Holds job ?1 until ?3 and marks its handler started, if ?2 still holds it and, with ?4 (a
-- handler's renewal, not a settlement's), no person cancelled it (`cancel_asked` then tells the
-- worker why it was not renewed).
UPDATE redrive_jobs SET lease_expires = ?3, started = 1
WHERE id = ?1 AND lease_token = ?2 AND (NOT ?4 OR cancel_requested_at IS NULL)
RETURNING id
