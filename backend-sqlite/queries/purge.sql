-- Up to ?2 records whose last failure is before ?1, deleted; their ids, to free their jobs and
-- alert keys.
DELETE FROM redrive_failed_jobs
WHERE id IN (SELECT id FROM redrive_failed_jobs WHERE last_failed_at < ?1 ORDER BY id LIMIT ?2)
RETURNING id, job_id
