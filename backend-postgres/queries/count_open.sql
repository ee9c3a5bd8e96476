SELECT count(*) FROM {schema}.failed_jobs WHERE state = 'open'
