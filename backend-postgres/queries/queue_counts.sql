-- Jobs queued, scheduled and running, and how long the oldest ready job has waited. Each figure
-- reads the partial index whose predicate is its state (`run_at` is set exactly when queued,
-- `locked_until` exactly when running), not the table.
SELECT
    (SELECT count(*) FROM {schema}.jobs WHERE run_at IS NOT NULL) AS queued,
    (SELECT count(*) FROM {schema}.jobs WHERE run_at > now()) AS scheduled,
    (SELECT count(*) FROM {schema}.jobs WHERE locked_until IS NOT NULL) AS running,
    (SELECT extract(epoch FROM now() - min(run_at))::float8 FROM {schema}.jobs
      WHERE run_at <= now()) AS oldest_ready_seconds
