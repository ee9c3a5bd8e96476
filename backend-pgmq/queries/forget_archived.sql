-- The archived messages of one key (their failure records' copies), deleted.
DELETE FROM pgmq.{archive} WHERE message ->> 'key' = $1
