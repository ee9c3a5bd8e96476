-- Takes a free slot of the first $2 of key $1 for holder $3, for $4 s: let go, or lapsed (its
-- holder's lease past: taken over), the lowest not locked by another taker. Where all of the key's
-- rows are held and it has fewer than $2, makes the rest, the first of them held. `took` or `made`
-- is the slot; neither with `short` true: another taker made the same rows at the same time (this
-- statement cannot see them), and the take is tried again. Neither, `short` false: all are held.
WITH free AS (
    SELECT slot FROM {schema}.flow_slots
    WHERE key = $1 AND slot < $2 AND until <= now()
    ORDER BY slot
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), took AS (
    UPDATE {schema}.flow_slots s
    SET token = $3, until = now() + make_interval(secs => $4::float8)
    FROM free
    WHERE s.key = $1 AND s.slot = free.slot
    RETURNING s.slot
), rows AS (
    SELECT count(*)::integer AS n FROM {schema}.flow_slots WHERE key = $1 AND slot < $2
), made AS (
    INSERT INTO {schema}.flow_slots (key, slot, token, until)
    SELECT $1, g, CASE WHEN g = n THEN $3::uuid END,
           CASE WHEN g = n THEN now() + make_interval(secs => $4::float8) ELSE '-infinity' END
    FROM rows, generate_series(n, $2 - 1) g
    WHERE NOT EXISTS (SELECT 1 FROM took)
    ON CONFLICT (key, slot) DO NOTHING
    RETURNING slot, token
)
SELECT (SELECT slot FROM took) AS took,
       (SELECT slot FROM made WHERE token = $3) AS made,
       (SELECT n < $2 FROM rows) AS short
