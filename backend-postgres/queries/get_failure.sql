SELECT * FROM {schema}.failed_jobs WHERE id = $1
