-- Takes the first free slot of the first $2 of key $1 for holder $3, for $4 s: never held, let go,
-- or lapsed (its holder's lease past: taken over). The upsert reads the key's row as it is once
-- locked, so takers racing for the last slot get it once between them. No row: all $2 are held.
INSERT INTO {schema}.flow_slots AS s (key, tokens, untils)
SELECT $1, ARRAY[$3::uuid], ARRAY[now() + make_interval(secs => $4::float8)]
WHERE $2::bigint > 0
ON CONFLICT (key) DO UPDATE
SET tokens[{schema}.flow_free_slot(s.untils, $2)] = excluded.tokens[1],
    untils[{schema}.flow_free_slot(s.untils, $2)] = excluded.untils[1]
WHERE {schema}.flow_free_slot(s.untils, $2) IS NOT NULL
RETURNING array_position(s.tokens, $3::uuid) - 1 AS slot
