-- The text as it is (inside the JSON's structure) or as it appears inside a JSON string (quotes,
-- backslashes and control characters escaped), so that any text is found.
SELECT EXISTS (
    SELECT 1 FROM {schema}.broker_records
    WHERE queue = $1
      AND (strpos(record::text, $2) > 0 OR strpos(record::text, btrim(to_json($2::text)::text, '"')) > 0)
) AS found
