-- $3: the new state; $4: whether a replay closes it or gives it back (from taken, whatever its
-- window). A replayed job can settle its record before the replay closes it (it ran at once and
-- was confirmed, or failed again): the replay's close then adds who and why to that state.
UPDATE {schema}.broker_records
SET state = CASE WHEN state IN ('confirmed', 'failed_again') THEN state ELSE $3::jsonb ->> 'state' END,
    closed = CASE WHEN state IN ('confirmed', 'failed_again')
                  THEN closed || jsonb_build_object('reason', $3::jsonb -> 'reason', 'actor', $3::jsonb -> 'actor')
                  ELSE $3 END,
    replay_until = NULL
WHERE queue = $1 AND id = $2
  AND ({schema}.broker_unclosed(state, replay_until)
       OR ($4 AND state = 'taken')
       OR ($4 AND $3::jsonb ->> 'state' = 'replaying' AND state IN ('confirmed', 'failed_again')
           AND closed ->> 'actor' IS NULL))
RETURNING id
