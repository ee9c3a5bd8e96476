-- Open records whose last failure is older than $1 seconds and whose first sink's alert is not
-- done (`redrive_alert:record=<id>:sink=0`, the key the workers' alerts hold): no worker sent it.
-- Record ids are numbers here, so the key needs no encoding. At most 200, how many are open, and
-- how many open records were alerted only to the log (the workers had no sink but the default).
SELECT (SELECT count(*) FROM {schema}.failed_jobs WHERE state = 'open') AS open,
       (SELECT count(*) FROM {schema}.failed_jobs f
        JOIN {schema}.processed_keys p ON p.idempotency_key = 'redrive_alert:record=' || f.id || ':sink=0'
        WHERE f.state = 'open' AND p.state = 'done' AND p.result ->> 'sink' = 'tracing') AS log_only,
       ARRAY(SELECT f.id::text
             FROM {schema}.failed_jobs f
             WHERE f.state = 'open' AND f.last_failed_at < now() - make_interval(secs => $1)
               AND NOT EXISTS (SELECT 1 FROM {schema}.processed_keys p
                               WHERE p.idempotency_key = 'redrive_alert:record=' || f.id || ':sink=0'
                                 AND p.state = 'done')
             ORDER BY f.id
             LIMIT 200) AS unalerted
