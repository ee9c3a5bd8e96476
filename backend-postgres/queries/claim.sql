-- Take up to {limit} ready jobs that no other worker holds, counting an attempt on each, under a fresh
-- lease token that fences every later call about the job. The rows are found by the ready index
-- and updated by primary key (`= ANY`), so the plan stays index-driven whatever the statistics.
--
-- The highest priority first, oldest first within one: the ready index is read at each priority
-- in `job_priorities`, highest first (`= ANY` on its first column: PostgreSQL reads the ranges in
-- the index's order), each range from its oldest job to its first one not yet due. So a claim
-- reads neither scheduled jobs nor, once it has its batch, the lower priorities.
--
-- The scan starts after ($5, $2, $3), the (priority, run_at, id) where this process's last full
-- batch ended, and then reads that priority alone: claimed jobs leave dead entries at the front
-- of each priority's range until VACUUM, and starting after them keeps a claim's cost flat however
-- many jobs ran since. A job of a higher priority enqueued meanwhile is behind the floor: it waits
-- for the floor to lapse (a second) or for a batch to come back short, as a job that commits late
-- does. NULLs scan every priority from the front. `ready_at` is each job's run_at before the
-- claim cleared it. The batch comes back in claim order: the worker starts its jobs in that order.
--
-- A job with an order key waits while an earlier job of its key is unfinished: queued (a retry
-- waiting its backoff too), running, or failed with its record open (a discard clears the failed
-- job's order key). Only the ids from `order_prev` (the key's highest when this job was enqueued)
-- up are read: a job of the key below it finished before `order_prev` could run, or holds it back
-- still (0 for the first of its key: jobs of the key enqueued at the same moment are in its range
-- too). So the probe of `jobs_order` reads a few entries, not the key's history. It reads the
-- snapshot, so two claims at once both see the earlier job as it was and neither takes the later
-- one. A job without an order key has no `order_prev` and skips it.
--
-- $4 is the kinds the worker has handlers for (NULL: any); a job of another kind stays for a worker
-- that has one. The kinds come through `ARRAY(SELECT …)` for the reason completions do: given the
-- values, a planner whose statistics do not know a kind (a new one, a rare one) expects no row to
-- match, and sorts the whole backlog instead of reading the ready index in order. `started` is
-- cleared: a claim that lapses before its handler starts is refunded.
--
-- {limit} is written into the text, one prepared statement per batch size, rather than bound: with
-- a bound LIMIT the generic plan assumes a tenth of the table, looks dearer than a custom plan,
-- and PostgreSQL plans the statement anew on every call.
WITH picked AS MATERIALIZED (
    SELECT id, run_at, priority FROM {schema}.jobs
    WHERE priority = ANY(CASE WHEN $5::smallint IS NULL THEN ARRAY(SELECT priority FROM {schema}.job_priorities)
                              ELSE ARRAY[$5::smallint] END)
      AND run_at <= now() AND (run_at, id) > (coalesce($2, '-infinity'::timestamptz), coalesce($3, 0::bigint))
      AND ($4::text[] IS NULL OR kind = ANY(ARRAY(SELECT unnest($4::text[]))))
      AND (order_prev IS NULL OR NOT EXISTS (
          SELECT 1 FROM {schema}.jobs earlier
          WHERE earlier.order_key = jobs.order_key AND earlier.id >= jobs.order_prev AND earlier.id < jobs.id
            AND earlier.status <> 'done'
      ))
    ORDER BY priority DESC, run_at, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.jobs j
    SET status = 'running',
        run_at = NULL,
        attempts = j.attempts + 1,
        claims = j.claims + 1,
        started = false,
        lease_token = gen_random_uuid(),
        locked_until = now() + make_interval(secs => $1),
        updated_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.kind, j.idempotency_key, j.provider_key, j.payload, j.attempts, j.claims, j.cap, j.severity,
              j.created_at, j.lease_token, j.stranded, j.deadline, j.priority, j.traceparent
)
SELECT claimed.*, picked.run_at AS ready_at FROM claimed JOIN picked USING (id)
ORDER BY picked.priority DESC, picked.run_at, id
