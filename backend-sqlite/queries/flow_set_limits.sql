-- Sets kind ?1's limits (NULL: none): ?2 concurrency, ?3 per ?4 µs the rate, ?5 per key, ?6 per
-- ?7 µs the rate per key.
INSERT INTO redrive_flow_kinds
    (kind, concurrency, rate_count, rate_per_us, key_concurrency, key_rate_count, key_rate_per_us)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency, rate_count = excluded.rate_count,
    rate_per_us = excluded.rate_per_us, key_concurrency = excluded.key_concurrency,
    key_rate_count = excluded.key_rate_count, key_rate_per_us = excluded.key_rate_per_us
