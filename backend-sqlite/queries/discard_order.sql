-- A discarded record's failed job ?1 loses its order key: dropped work no longer holds the later
-- jobs of its key back. Whether it had one (they may be claimed now).
UPDATE redrive_jobs SET order_key = NULL
WHERE id = ?1 AND status = 'failed' AND order_key IS NOT NULL
RETURNING id
