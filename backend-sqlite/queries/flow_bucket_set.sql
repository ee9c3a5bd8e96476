-- Sets bucket ?1's time to ?2 µs.
INSERT INTO redrive_flow_buckets (key, tat) VALUES (?1, ?2)
ON CONFLICT (key) DO UPDATE SET tat = excluded.tat
