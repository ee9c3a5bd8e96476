-- pgmq's create: the queue's table and its archive (nothing if they exist).
SELECT pgmq.create($1)
