-- Closes a replaying record (or one still taken by its replay) as discarded ($3, the whole
-- state): its replayed job was cancelled and will never settle it. Anything else is left as it is.
UPDATE {schema}.broker_records
SET state = 'discarded', replay_until = NULL, closed = $3
WHERE queue = $1 AND id = $2 AND state IN ('replaying', 'taken')
RETURNING id
