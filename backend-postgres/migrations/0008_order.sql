-- Order per key (`Job::order_key`): jobs that share an order key run one at a time, in the order
-- of their ids. `order_prev` is the highest id the key had when the job was enqueued (0 if none): every
-- earlier job of the key either is at or above it, or finished before it could run, so a claim
-- need only look between the two. Both nullable and without a default, so adding them rewrites
-- nothing, and a queue that never sets them never writes an entry into the index below.
ALTER TABLE {schema}.jobs ADD COLUMN order_key text;
ALTER TABLE {schema}.jobs ADD COLUMN order_prev bigint;

-- Every job of a key, finished or not: the newest is found at the top of its range (an enqueue's
-- `order_prev`), and a claim reads the few entries between a job's `order_prev` and itself. An
-- index of unfinished jobs only would be smaller, but every claim and completion leaves a dead
-- entry in it until VACUUM, and a key's whole history of dead entries would sit in front of the
-- probe (measured: 0.17× the unordered burn-down); a bounded range does not care.
CREATE INDEX jobs_order ON {schema}.jobs (order_key, id) WHERE order_key IS NOT NULL;
