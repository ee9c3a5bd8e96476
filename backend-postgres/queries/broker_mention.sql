SELECT EXISTS (
    SELECT 1 FROM {schema}.broker_records WHERE queue = $1 AND strpos(record::text, $2) > 0
) AS found
