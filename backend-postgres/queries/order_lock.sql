-- Enqueues of one order key take turns, until their transactions end: the next one draws its id
-- after the last one committed, and its next statement sees it (READ COMMITTED), so ids follow
-- commit order within a key and `order_prev` is never a job that commits later below a job that
-- runs first. Its own statement, before the insert, for that reason. Keys in sorted order, so two
-- batches sharing keys wait for each other rather than deadlock.
SELECT count(pg_advisory_xact_lock(hashtextextended('{schema}.order:' || key, 0)))
FROM (SELECT DISTINCT unnest($1::text[]) AS key ORDER BY 1) keys
