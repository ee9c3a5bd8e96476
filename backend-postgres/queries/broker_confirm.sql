-- Settles a replaying record (or one still taken by its replay: the job ran before the replay
-- closed it) as confirmed, keeping who replayed it and why; anything else is left as it is.
UPDATE {schema}.broker_records
SET state = 'confirmed', replay_until = NULL,
    closed = closed || jsonb_build_object('state', 'confirmed', 'confirmed_at', now())
WHERE queue = $1 AND id = $2 AND state IN ('replaying', 'taken')
RETURNING id
