-- Schema $1's tables whose cleanup or statistics have fallen behind: more dead rows than twice
-- what would start a vacuum (autovacuum_vacuum_threshold + scale factor × rows), or more rows
-- changed since the last analyze than twice what would start one, and either over 10,000 rows
-- (below that a table is small enough not to matter). The server's settings, not the tables'.
SELECT s.relname::text AS table_name, s.n_dead_tup AS dead, s.n_mod_since_analyze AS changed,
       s.n_dead_tup > greatest(10000, 2 * (current_setting('autovacuum_vacuum_threshold')::float8
           + current_setting('autovacuum_vacuum_scale_factor')::float8 * greatest(c.reltuples, 0))) AS vacuum_behind,
       s.n_mod_since_analyze > greatest(10000, 2 * (current_setting('autovacuum_analyze_threshold')::float8
           + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0))) AS analyze_behind
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = $1
ORDER BY 1
