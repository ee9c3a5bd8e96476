-- pgmq's send, each job with its own headers and visibility time, all in one statement: a batch
-- is sent whole or not at all. Ids in the order of the jobs.
SELECT pgmq.send($1, job.message, job.headers, job.visible_at) AS msg_id
FROM unnest($2::jsonb[], $3::jsonb[], $4::timestamptz[]) WITH ORDINALITY
     AS job(message, headers, visible_at, n)
ORDER BY job.n
