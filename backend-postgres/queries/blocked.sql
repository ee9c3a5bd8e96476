-- The order keys held back by an open failure record: the record's job failed and still has its
-- order key. `waiting` counts the later unfinished jobs of the key (through `jobs_order`).
SELECT f.id, f.kind, f.idempotency_key, j.order_key,
       (SELECT count(*) FROM {schema}.jobs w
        WHERE w.order_key = j.order_key AND w.id > j.id AND w.status <> 'done') AS waiting
FROM {schema}.failed_jobs f
JOIN {schema}.jobs j ON j.id = f.job_id
WHERE f.state = 'open' AND j.status = 'failed' AND j.order_key IS NOT NULL
ORDER BY f.id
LIMIT 1000
