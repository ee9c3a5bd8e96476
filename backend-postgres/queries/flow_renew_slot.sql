-- Holds slot $2 of key $1 for $4 s more if holder $3 still has it. No row: it was taken over.
UPDATE {schema}.flow_slots
SET until = now() + make_interval(secs => $4::float8)
WHERE key = $1 AND slot = $2 AND token = $3
RETURNING 1
