-- Every queue's open broker records (a broker's records database may keep several queues'),
-- oldest first, at most 1000; whether each failed longer than $1 seconds ago; and how many are
-- open in all. Their alert keys are written in Rust: a broker's record id needs the key's
-- encoding.
SELECT id, last_failed_at < now() - make_interval(secs => $1) AS overdue, count(*) OVER () AS open
FROM {schema}.broker_records
WHERE state = 'open'
ORDER BY last_failed_at
LIMIT 1000
