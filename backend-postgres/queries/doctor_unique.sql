-- The unique indexes of schema $1's tables, each with its columns in order and whether an
-- `ON CONFLICT` can use it: built and valid, checked at once (not deferrable), over every row.
SELECT t.relname::text AS table_name, i.relname::text AS index_name,
       x.indisvalid AND x.indisready AND x.indislive AS valid, x.indimmediate AS immediate,
       x.indpred IS NULL AS whole,
       ARRAY(SELECT a.attname::text
             FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             ORDER BY k.n) AS columns
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = $1 AND x.indisunique
