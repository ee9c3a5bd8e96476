-- Replays confirmed by their effect. A replayed record is `replaying` until its job settles:
-- `confirmed` when the job completes (with when), `failed_again` when the job ends as a new
-- record, which names it (`replay_of`) as it names the new one (`next_record`). `amended` is the
-- payload a person's amended replay sent in place of the record's own. SQLite cannot change a
-- CHECK constraint: the tables are rebuilt, their rows and indexes as they were.
CREATE TABLE redrive_failed_jobs_new (
    id              INTEGER PRIMARY KEY,
    job_id          INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    provider_key    TEXT NOT NULL,
    payload         TEXT NOT NULL,
    last_error      TEXT NOT NULL,
    errors          TEXT NOT NULL,          -- JSON: every failed attempt of the run
    attempts        INTEGER NOT NULL,
    cap             INTEGER NOT NULL,
    severity        TEXT NOT NULL,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    state           TEXT NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'replaying', 'confirmed', 'failed_again', 'discarded')),
    closed_at       INTEGER,
    discard_reason  TEXT,
    discard_actor   TEXT,
    replay_reason   TEXT,
    replay_actor    TEXT,
    confirmed_at    INTEGER,
    failed_again_at INTEGER,
    next_record     INTEGER,
    replay_of       INTEGER,
    amended         TEXT                    -- JSON: the amended replay's payload
);
-- Records replayed before, settled as their jobs came to: failed again where a later record of
-- the job exists (linked both ways), confirmed where the job is done or gone (only done jobs are
-- pruned), replaying while it waits.
INSERT INTO redrive_failed_jobs_new (id, job_id, kind, idempotency_key, provider_key, payload, last_error, errors,
                                     attempts, cap, severity, first_failed_at, last_failed_at, state, closed_at,
                                     discard_reason, discard_actor, replay_reason, replay_actor, confirmed_at,
                                     failed_again_at, next_record, replay_of)
SELECT f.id, f.job_id, f.kind, f.idempotency_key, f.provider_key, f.payload, f.last_error, f.errors, f.attempts,
       f.cap, f.severity, f.first_failed_at, f.last_failed_at,
       CASE WHEN f.state <> 'replayed' THEN f.state
            WHEN n.id IS NOT NULL THEN 'failed_again'
            WHEN j.id IS NULL OR j.status = 'done' THEN 'confirmed'
            ELSE 'replaying' END,
       f.closed_at, f.discard_reason, f.discard_actor, f.replay_reason, f.replay_actor,
       CASE WHEN f.state = 'replayed' AND n.id IS NULL AND (j.id IS NULL OR j.status = 'done')
            THEN coalesce(j.done_at, f.closed_at) END,
       CASE WHEN f.state = 'replayed' THEN n.last_failed_at END,
       CASE WHEN f.state = 'replayed' THEN n.id END,
       (SELECT max(old.id) FROM redrive_failed_jobs old
        WHERE old.job_id = f.job_id AND old.id < f.id AND old.state = 'replayed')
FROM redrive_failed_jobs f
LEFT JOIN redrive_jobs j ON j.id = f.job_id
LEFT JOIN redrive_failed_jobs n ON n.id = (SELECT min(later.id) FROM redrive_failed_jobs later
                                           WHERE later.job_id = f.job_id AND later.id > f.id);
DROP TABLE redrive_failed_jobs;
ALTER TABLE redrive_failed_jobs_new RENAME TO redrive_failed_jobs;
CREATE INDEX redrive_failed_jobs_open ON redrive_failed_jobs (id) WHERE state = 'open';
CREATE INDEX redrive_failed_jobs_key ON redrive_failed_jobs (idempotency_key);
CREATE INDEX redrive_failed_jobs_job ON redrive_failed_jobs (job_id);
CREATE INDEX redrive_failed_jobs_age ON redrive_failed_jobs (last_failed_at);

-- The broker stores: a replay's take is `taken` (it was `replaying`), a sent replay `replaying`
-- (it was `replayed`), as `RecordState` names it.
CREATE TABLE redrive_broker_records_new (
    seq             INTEGER PRIMARY KEY,    -- insertion order (one writer: commit order); pages follow it
    queue           TEXT NOT NULL,
    id              TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    record          TEXT NOT NULL,          -- the whole record as written, JSON; its state is below
    state           TEXT NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'taken', 'replaying', 'confirmed', 'failed_again', 'discarded')),
    replay_until    INTEGER,                -- a replay's window: past it, a record still taken reads as open
    closed          TEXT,                   -- the closed state (`RecordState` as JSON)
    UNIQUE (queue, id)
);
INSERT INTO redrive_broker_records_new (seq, queue, id, job_id, kind, idempotency_key, last_failed_at, record, state,
                                        replay_until, closed)
SELECT seq, queue, id, job_id, kind, idempotency_key, last_failed_at, record,
       -- A replay sent before is confirmed at its send: its message carried no record id, so
       -- nothing would ever settle it.
       CASE state WHEN 'replaying' THEN 'taken' WHEN 'replayed' THEN 'confirmed' ELSE state END,
       replay_until,
       CASE state WHEN 'replaying' THEN json_set(closed, '$.state', 'replaying')
                  WHEN 'replayed' THEN json_set(closed, '$.state', 'confirmed', '$.confirmed_at', json_extract(closed, '$.at'))
                  ELSE closed END
FROM redrive_broker_records;
DROP TABLE redrive_broker_records;
ALTER TABLE redrive_broker_records_new RENAME TO redrive_broker_records;
CREATE INDEX redrive_broker_records_key ON redrive_broker_records (queue, idempotency_key);
CREATE INDEX redrive_broker_records_unclosed ON redrive_broker_records (queue) WHERE state IN ('open', 'taken');
CREATE INDEX redrive_broker_records_age ON redrive_broker_records (queue, last_failed_at);

-- The record a queued or running job replays, set by the replay: its completion confirms that
-- record, its failure links it to the new one. Replays in flight take theirs now.
ALTER TABLE redrive_jobs ADD COLUMN replay_of INTEGER;
UPDATE redrive_jobs
SET replay_of = (SELECT max(f.id) FROM redrive_failed_jobs f WHERE f.job_id = redrive_jobs.id AND f.state = 'replaying')
WHERE status IN ('queued', 'running');
