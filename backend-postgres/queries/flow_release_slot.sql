-- Frees slot $2 of key $1 if holder $3 still has it; a slot taken over stays with its new holder.
UPDATE {schema}.flow_slots
SET tokens[$2::int + 1] = NULL, untils[$2::int + 1] = NULL
WHERE key = $1 AND tokens[$2::int + 1] = $3::uuid
