-- Holds slot $2 of key $1 for $4 s more if holder $3 still has it. No row: it was taken over.
UPDATE {schema}.flow_slots
SET untils[$2::int + 1] = now() + make_interval(secs => $4::float8)
WHERE key = $1 AND tokens[$2::int + 1] = $3::uuid
RETURNING 1
