-- Replays confirmed by their effect. A replayed record is `replaying` until its job settles:
-- `confirmed` when the job completes (its effect done once, with when), `failed_again` when the
-- job ends as a new record, which names it (`replay_of`) as it names the new one (`next_record`).
-- `amended` is the payload a person's amended replay sent in place of the record's own.
ALTER TABLE {schema}.failed_jobs DROP CONSTRAINT failed_jobs_state_check;
ALTER TABLE {schema}.failed_jobs
    ADD COLUMN confirmed_at    timestamptz,
    ADD COLUMN failed_again_at timestamptz,
    ADD COLUMN next_record     bigint,
    ADD COLUMN replay_of       bigint,
    ADD COLUMN amended         jsonb;
-- Records replayed before, settled as their jobs came to: failed again where a later record of
-- the job exists (linked both ways), confirmed where the job is done or gone (only done jobs are
-- pruned), replaying while it waits.
UPDATE {schema}.failed_jobs f
SET state = 'failed_again', failed_again_at = n.last_failed_at, next_record = n.id
FROM (SELECT DISTINCT ON (old.id) old.id AS old_id, newer.id, newer.last_failed_at
      FROM {schema}.failed_jobs old
      JOIN {schema}.failed_jobs newer ON newer.job_id = old.job_id AND newer.id > old.id
      WHERE old.state = 'replayed'
      ORDER BY old.id, newer.id) n
WHERE f.id = n.old_id;
UPDATE {schema}.failed_jobs newer SET replay_of = old.id
FROM {schema}.failed_jobs old
WHERE old.state = 'failed_again' AND old.next_record = newer.id;
UPDATE {schema}.failed_jobs f
SET state = 'confirmed',
    confirmed_at = coalesce((SELECT j.updated_at FROM {schema}.jobs j WHERE j.id = f.job_id), f.closed_at)
WHERE f.state = 'replayed'
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.id = f.job_id AND j.status <> 'done');
UPDATE {schema}.failed_jobs SET state = 'replaying' WHERE state = 'replayed';
-- Checked without holding the table's write lock for the scan (NOT VALID, then VALIDATE). Stop the
-- workers and tools of the version before first: they write 'replayed', which this refuses.
ALTER TABLE {schema}.failed_jobs ADD CONSTRAINT failed_jobs_state_check
    CHECK (state IN ('open', 'replaying', 'confirmed', 'failed_again', 'discarded')) NOT VALID;
ALTER TABLE {schema}.failed_jobs VALIDATE CONSTRAINT failed_jobs_state_check;
-- A completion looks for its job's replaying record: a probe of this (mostly empty) index per
-- batch, not a scan of the records.
CREATE INDEX failed_jobs_replaying ON {schema}.failed_jobs (job_id) WHERE state = 'replaying';

-- The broker stores: a replay's take is `taken` (it was `replaying`). A replay sent before is
-- `confirmed` at its send: its message carried no record id, so nothing would ever settle it (a
-- replayed job that failed again left a record of its own, unlinked).
DROP INDEX {schema}.broker_records_unclosed;
UPDATE {schema}.broker_records SET state = 'taken' WHERE state = 'replaying';
UPDATE {schema}.broker_records
SET state = 'confirmed',
    closed = closed || jsonb_build_object('state', 'confirmed', 'confirmed_at', closed -> 'at')
WHERE state = 'replayed';
CREATE OR REPLACE FUNCTION {schema}.broker_unclosed(state text, replay_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT state = 'open' OR (state = 'taken' AND replay_until < now()) $$;
CREATE INDEX broker_records_unclosed ON {schema}.broker_records (queue) WHERE state IN ('open', 'taken');
