-- $2..$7 are arrays, one element per record. A new record of a replayed job that failed again
-- (its `replay_of`) settles the replayed record as `failed_again`, naming the new one, in the
-- same statement. Answers how many records were new.
WITH kept AS (
    INSERT INTO {schema}.broker_records (queue, id, job_id, kind, idempotency_key, last_failed_at, record)
    SELECT $1, r.id, r.job_id, r.kind, r.key, r.at, r.record::json
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[])
        AS r(id, job_id, kind, key, at, record)
    ON CONFLICT (queue, id) DO NOTHING
    RETURNING id, last_failed_at, record ->> 'replay_of' AS replay_of
), linked AS (
    UPDATE {schema}.broker_records old
    SET state = 'failed_again', replay_until = NULL,
        closed = old.closed || jsonb_build_object('state', 'failed_again', 'failed_at', kept.last_failed_at,
                                                  'next', kept.id)
    FROM kept
    WHERE old.queue = $1 AND old.id = kept.replay_of AND old.state IN ('replaying', 'taken')
)
SELECT count(*) AS kept FROM kept
