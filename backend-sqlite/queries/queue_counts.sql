-- Each figure reads the partial index of its state. ?1 now.
SELECT
    (SELECT count(*) FROM redrive_jobs WHERE status = 'queued') AS queued,
    (SELECT count(*) FROM redrive_jobs WHERE status = 'queued' AND ready_at > ?1) AS scheduled,
    (SELECT count(*) FROM redrive_jobs WHERE status = 'running') AS running,
    (SELECT min(ready_at) FROM redrive_jobs WHERE status = 'queued' AND ready_at <= ?1) AS oldest_ready
