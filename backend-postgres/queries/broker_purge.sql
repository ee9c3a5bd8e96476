WITH gone AS (
    DELETE FROM {schema}.broker_records
    WHERE queue = $1 AND last_failed_at < now() - make_interval(secs => $2)
    RETURNING 1
)
SELECT count(*) AS purged FROM gone
