-- Mark jobs done with their results, each fenced by its lease token. The token stays on the done
-- row so that repeating this statement (after a lost connection) is recognised as already applied.
--
-- The rows are found by primary key whatever the statistics say. Joined to the batch on id and
-- token, a plan made from statistics taken while every job was queued estimated one running row,
-- scanned `jobs` whole as the outer side of a nested loop and re-read the batch for each row
-- (seconds per statement). Here the ids come through `ARRAY(SELECT …)`, whose length the planner
-- cannot see, so no batch looks large enough to scan the table for. Tokens are unique per claim:
-- a row whose id and token are both in the batch was sent with that very pair, and its result is
-- the one at its token's place (a repeat without a result keeps the stored one).
--
-- A job with an order key that finishes lets the next of its key run: the workers are told at
-- commit (as an enqueue tells them), rather than finding it at their next poll.
--
-- A replayed job that finishes confirms its record, in the same statement: the effect is done
-- once, and the record says when. Its probe reads the partial index of replaying records, which
-- is empty but for replays in flight.
WITH done AS (
    UPDATE {schema}.jobs
    SET status = 'done', result = coalesce(($3::jsonb[])[array_position($2::uuid[], lease_token)], result),
        locked_until = NULL, updated_at = now()
    WHERE id = ANY(ARRAY(SELECT unnest($1::bigint[]))) AND lease_token = ANY($2::uuid[])
    RETURNING id, lease_token, order_key
), confirmed AS (
    UPDATE {schema}.failed_jobs SET state = 'confirmed', confirmed_at = now()
    WHERE state = 'replaying' AND job_id = ANY(ARRAY(SELECT id FROM done))
), woken AS (
    SELECT count(pg_notify('{channel}', '')) AS n FROM (SELECT 1 FROM done WHERE order_key IS NOT NULL LIMIT 1) one
)
SELECT done.id, done.lease_token FROM done, woken
