-- Jobs queued and running. Each count reads the partial index whose predicate is its state
-- (`run_at` is set exactly when queued, `locked_until` exactly when running), not the table.
SELECT
    (SELECT count(*) FROM {schema}.jobs WHERE run_at IS NOT NULL) AS queued,
    (SELECT count(*) FROM {schema}.jobs WHERE locked_until IS NOT NULL) AS running
