-- A failed job with no record left. ?1 job id.
DELETE FROM redrive_jobs
WHERE id = ?1 AND status = 'failed'
  AND NOT EXISTS (SELECT 1 FROM redrive_failed_jobs f WHERE f.job_id = ?1)
