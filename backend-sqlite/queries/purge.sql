-- Records whose last failure is before ?1, deleted; their ids, to free their jobs and alert keys.
DELETE FROM redrive_failed_jobs WHERE last_failed_at < ?1 RETURNING id, job_id
