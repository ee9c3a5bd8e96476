SELECT id, idempotency_key, fingerprint FROM {schema}.jobs WHERE idempotency_key = ANY($1::text[])
