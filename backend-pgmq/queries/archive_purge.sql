-- Archived messages older than $1 seconds, deleted with the records a purge of that age removes.
DELETE FROM pgmq.{archive} WHERE archived_at < now() - make_interval(secs => $1)
