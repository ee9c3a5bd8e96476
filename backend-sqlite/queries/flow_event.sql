-- A flow event: at ?1, kind ?2, action ?3, by ?4, detail ?5.
INSERT INTO redrive_flow_events (at, kind, action, by, detail) VALUES (?1, ?2, ?3, ?4, ?5)
