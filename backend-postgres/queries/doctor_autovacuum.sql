-- Whether the server vacuums and analyzes (both settings), and schema $1's tables that turned it
-- off for themselves.
SELECT current_setting('autovacuum') AS autovacuum, current_setting('track_counts') AS track_counts,
       ARRAY(SELECT c.relname::text
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind = 'r'
               AND EXISTS (SELECT 1 FROM unnest(c.reloptions) o
                           WHERE lower(o) IN ('autovacuum_enabled=false', 'autovacuum_enabled=off',
                                              'autovacuum_enabled=0', 'autovacuum_enabled=no'))
             ORDER BY 1) AS disabled
