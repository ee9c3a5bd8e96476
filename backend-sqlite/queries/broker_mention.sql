-- The text as it is, or as it appears inside a JSON string (quotes, backslashes and control
-- characters escaped): ?3 is the text JSON-encoded without its quotes.
SELECT EXISTS (
    SELECT 1 FROM redrive_broker_records
    WHERE queue = ?1 AND (instr(record, ?2) > 0 OR instr(record, ?3) > 0)
) AS found
