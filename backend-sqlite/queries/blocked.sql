-- The order keys held up by an open record, oldest record first: its failed job still has an
-- order key (a discard clears it), and the jobs of that key behind it that are not done wait.
SELECT f.id AS record, j.order_key, f.kind, f.idempotency_key, f.job_id,
       (SELECT count(*) FROM redrive_jobs AS w
        WHERE w.order_key = j.order_key AND w.id > j.id AND w.status <> 'done') AS waiting
FROM redrive_failed_jobs AS f
JOIN redrive_jobs AS j ON j.id = f.job_id
WHERE f.state = 'open' AND j.status = 'failed' AND j.order_key IS NOT NULL
ORDER BY f.id
