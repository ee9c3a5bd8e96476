-- Takes up to $4 starts from bucket $1 of a rate whose interval is $2 µs and period $3 µs: the
-- GCRA step of `redrive_core::kit::gcra`, computed on the row's latest version under its lock, on
-- the database's clock. A new bucket starts full. A take that is granted nothing leaves the time
-- as it is (it is then ahead of now), and its wait is until one interval is back within the period.
WITH p AS MATERIALIZED (
    SELECT $1::text AS key, $2::bigint AS step, $3::bigint AS per, $4::bigint AS want,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
), taken AS (
    INSERT INTO {schema}.flow_buckets AS b (key, tat, before)
    SELECT key, now + step * least(per / step, want), NULL FROM p
    ON CONFLICT (key) DO UPDATE
    SET before = b.tat,
        tat = (SELECT greatest(b.tat, now) + step * least(greatest((now + per - greatest(b.tat, now)) / step, 0), want)
               FROM p)
    RETURNING b.before, b.tat
)
-- `greatest` passes over NULL: a new bucket's start is now.
SELECT (tat - greatest(before, now)) / step AS granted,
       greatest(greatest(before, now) + step - per - now, 1) AS wait_us
FROM taken, p
