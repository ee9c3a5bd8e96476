-- Key ?1's job, whatever its state but running (`Forget::forget_key`): the key is free.
DELETE FROM redrive_jobs WHERE idempotency_key = ?1 AND status <> 'running'
