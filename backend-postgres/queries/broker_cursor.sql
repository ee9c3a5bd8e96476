SELECT seq FROM {schema}.broker_records WHERE queue = $1 AND id = $2
