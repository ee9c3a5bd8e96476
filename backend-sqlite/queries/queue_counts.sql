-- Each figure reads the partial index of its state. ?1 now. The ready index is by priority first,
-- so the scheduled jobs and the oldest ready one are read a priority at a time (see claim.sql).
SELECT
    (SELECT count(*) FROM redrive_jobs WHERE status = 'queued') AS queued,
    (SELECT count(*) FROM redrive_jobs
      WHERE status = 'queued' AND priority IN (SELECT priority FROM redrive_priorities) AND ready_at > ?1) AS scheduled,
    (SELECT count(*) FROM redrive_jobs WHERE status = 'running') AS running,
    (SELECT min((SELECT min(ready_at) FROM redrive_jobs
                 WHERE status = 'queued' AND priority = p.priority AND ready_at <= ?1))
      FROM redrive_priorities p) AS oldest_ready
