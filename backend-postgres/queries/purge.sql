DELETE FROM {schema}.failed_jobs WHERE last_failed_at < now() - make_interval(secs => $1)
