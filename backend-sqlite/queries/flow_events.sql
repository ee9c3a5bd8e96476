-- The latest ?2 flow events, newest first: of kind ?1, or of every kind where ?1 is NULL.
SELECT at, kind, action, by, detail
FROM redrive_flow_events
WHERE ?1 IS NULL OR kind = ?1
ORDER BY seq DESC
LIMIT ?2
