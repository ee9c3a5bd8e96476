-- pgmq's delete of many finished messages at once, each fenced: only a message still under the
-- read that finished it (no later read took it). The ids and reads deleted. With them, the
-- effects of the holds the claims took ($3 keys, $4 results) marked done in the ledger, whatever
-- the fence says: the effect happened (a cancel asked meanwhile is done all the same).
WITH done AS (
    DELETE FROM pgmq.{queue} m
    USING unnest($1::bigint[], $2::timestamptz[]) AS d(msg_id, read_at)
    WHERE m.msg_id = d.msg_id AND m.last_read_at = d.read_at
    RETURNING m.msg_id, m.last_read_at
), effects AS (
    UPDATE {schema}.processed_keys p
    SET state = 'done', result = e.result, holder = NULL, held_until = NULL, updated_at = now()
    FROM unnest($3::text[], $4::jsonb[]) AS e(idempotency_key, result)
    WHERE p.idempotency_key = e.idempotency_key AND p.state IN ('pending', 'cancelled')
)
SELECT msg_id, last_read_at FROM done
