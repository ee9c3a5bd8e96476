-- Takes the first free slot of the first ?2 of key ?1 for holder ?3 until ?4: never held, let go,
-- or lapsed at ?5 (its holder's lease past: taken over). One statement holds the write lock from
-- its read to its write, so takers racing for the last slot get it once. No row: all are held.
WITH RECURSIVE n(slot) AS (
    SELECT 0 WHERE ?2 > 0
    UNION ALL
    SELECT slot + 1 FROM n WHERE slot + 1 < ?2
)
INSERT INTO redrive_flow_slots (key, slot, token, until)
SELECT ?1, slot, ?3, ?4 FROM n
WHERE NOT EXISTS (
    SELECT 1 FROM redrive_flow_slots held WHERE held.key = ?1 AND held.slot = n.slot AND held.until > ?5
)
ORDER BY slot
LIMIT 1
ON CONFLICT (key, slot) DO UPDATE SET token = excluded.token, until = excluded.until
RETURNING slot
