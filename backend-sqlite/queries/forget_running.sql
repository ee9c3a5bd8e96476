-- Whether a job of key ?1 is running: `Forget::forget_key` then changes nothing.
SELECT 1 FROM redrive_jobs WHERE idempotency_key = ?1 AND status = 'running'
