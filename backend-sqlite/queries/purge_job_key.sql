-- A failed job with no record left loses its key's ledger entry (then the job goes, see
-- purge_job.sql): the payload is then nowhere, and the key is free. ?1 job id.
DELETE FROM redrive_processed_keys
WHERE idempotency_key = (
    SELECT idempotency_key FROM redrive_jobs j
    WHERE j.id = ?1 AND j.status = 'failed'
      AND NOT EXISTS (SELECT 1 FROM redrive_failed_jobs f WHERE f.job_id = j.id)
)
