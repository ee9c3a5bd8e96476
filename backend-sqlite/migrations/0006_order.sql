-- Order per key: jobs that share an order key (any kind) run one at a time, in id order. A job
-- waits while one of its key with a lower id is not done (queued, running, or failed with its
-- record open); a discard sets the failed job's order key to NULL, so it no longer holds the rest.
ALTER TABLE redrive_jobs ADD COLUMN order_key TEXT;

-- The claim's check for an earlier unfinished job of the key, and `blocked`'s count of the jobs
-- behind one: the unfinished jobs of each order key, by id. The status is in it so that both
-- read the index alone (they repeat `status <> 'done'`, without which SQLite would not use it).
-- Queues that use no order keys add nothing to it.
CREATE INDEX redrive_jobs_order ON redrive_jobs (order_key, id, status)
WHERE order_key IS NOT NULL AND status <> 'done';

-- The claim reads the ready jobs in this index, and now their order key too (NULL: no check): in
-- the index, a claim of any kind still reads nothing else of a job it passes over.
DROP INDEX redrive_jobs_ready;
CREATE INDEX redrive_jobs_ready ON redrive_jobs (ready_at, id, order_key) WHERE status = 'queued';
