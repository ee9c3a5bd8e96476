-- Done, if ?2 still holds job ?1. ?3 now. Whether it had an order key: the next job of the key
-- may be claimed now; the record it replays, if any: confirmed with it.
UPDATE redrive_jobs
SET status = 'done', lease_token = NULL, lease_expires = NULL, errors = '[]', done_at = ?3
WHERE id = ?1 AND lease_token = ?2
RETURNING order_key IS NOT NULL AS ordered, replay_of
