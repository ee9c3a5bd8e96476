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
-- Records replayed before: confirmed where the job is done since (when it was last updated),
-- replaying otherwise.
UPDATE {schema}.failed_jobs f
SET state = CASE WHEN j.status = 'done' THEN 'confirmed' ELSE 'replaying' END,
    confirmed_at = CASE WHEN j.status = 'done' THEN j.updated_at END
FROM {schema}.jobs j
WHERE f.state = 'replayed' AND j.id = f.job_id;
UPDATE {schema}.failed_jobs SET state = 'replaying' WHERE state = 'replayed';
ALTER TABLE {schema}.failed_jobs ADD CONSTRAINT failed_jobs_state_check
    CHECK (state IN ('open', 'replaying', 'confirmed', 'failed_again', 'discarded'));
-- A completion looks for its job's replaying record: a probe of this (mostly empty) index per
-- batch, not a scan of the records.
CREATE INDEX failed_jobs_replaying ON {schema}.failed_jobs (job_id) WHERE state = 'replaying';

-- The broker stores: a replay's take is `taken` (it was `replaying`), and a sent replay is
-- `replaying` (it was `replayed`), as `RecordState` names it.
DROP INDEX {schema}.broker_records_unclosed;
UPDATE {schema}.broker_records SET state = 'taken' WHERE state = 'replaying';
UPDATE {schema}.broker_records
SET state = 'replaying', closed = jsonb_set(closed, '{state}', '"replaying"')
WHERE state = 'replayed';
CREATE OR REPLACE FUNCTION {schema}.broker_unclosed(state text, replay_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT state = 'open' OR (state = 'taken' AND replay_until < now()) $$;
CREATE INDEX broker_records_unclosed ON {schema}.broker_records (queue) WHERE state IN ('open', 'taken');
