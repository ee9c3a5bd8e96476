-- Jobs queued, scheduled and running, and how long the oldest ready job has waited. Each figure
-- reads the partial index whose predicate is its state (`run_at` is set exactly when queued,
-- `locked_until` exactly when running), not the table. The ready index is by priority first, so
-- the scheduled jobs and the oldest ready one are read a priority at a time (see claim.sql): a
-- range per priority, not the whole index.
SELECT
    (SELECT count(*) FROM {schema}.jobs WHERE run_at IS NOT NULL) AS queued,
    (SELECT coalesce(sum(s.n), 0)::bigint FROM {schema}.job_priorities p CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM {schema}.jobs WHERE priority = p.priority AND run_at > now()
    ) s) AS scheduled,
    (SELECT count(*) FROM {schema}.jobs WHERE locked_until IS NOT NULL) AS running,
    (SELECT extract(epoch FROM now() - min(o.run_at))::float8 FROM {schema}.job_priorities p CROSS JOIN LATERAL (
        SELECT run_at FROM {schema}.jobs WHERE priority = p.priority AND run_at <= now() ORDER BY run_at LIMIT 1
    ) o) AS oldest_ready_seconds
