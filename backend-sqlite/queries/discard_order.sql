-- The failed job of record ?1, just discarded, loses its order key: dropped work no longer holds
-- the later jobs of its key back. Whether it had one (they may be claimed now).
UPDATE redrive_jobs SET order_key = NULL
WHERE id = (SELECT job_id FROM redrive_failed_jobs WHERE id = ?1) AND status = 'failed' AND order_key IS NOT NULL
RETURNING id
