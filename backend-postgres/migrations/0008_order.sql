-- Order per key (`Job::order_key`): jobs that share an order key run one at a time, in the order
-- of their ids. Nullable and without a default, so adding it rewrites nothing, and a queue that
-- never sets it never writes an entry into the index below.
ALTER TABLE {schema}.jobs ADD COLUMN order_key text;

-- What a claim asks of a job with an order key: is an earlier job of its key unfinished? Only
-- unfinished jobs are indexed, so a long-lived key (an account) costs a claim its open jobs, not
-- its history. A failed job stays (its open record holds the key) until a discard clears its
-- order key.
CREATE INDEX jobs_order ON {schema}.jobs (order_key, id) WHERE order_key IS NOT NULL AND status <> 'done';
