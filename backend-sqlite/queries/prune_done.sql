-- Jobs done before ?1, up to ?2 of them.
DELETE FROM redrive_jobs
WHERE id IN (SELECT id FROM redrive_jobs WHERE status = 'done' AND done_at < ?1 ORDER BY done_at LIMIT ?2)
