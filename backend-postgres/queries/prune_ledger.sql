-- Delete up to $2 effect-ledger rows of keys done more than $1 seconds ago (other queues' jobs,
-- alerts) and same-database effects applied as long ago, with `prune_done`. Maintenance, run now
-- and then: the rows hold no payload, only keys, fingerprints and results.
WITH keys AS (
    DELETE FROM {schema}.processed_keys
    WHERE idempotency_key = ANY(ARRAY(
        SELECT idempotency_key FROM {schema}.processed_keys
        WHERE state = 'done' AND updated_at < now() - make_interval(secs => $1)
          -- Alert keys stay while their record may: pruned, the sweep would alert it again.
          -- `purge` removes them with their records.
          AND idempotency_key NOT LIKE 'redrive\_alert:%'
        ORDER BY updated_at
        LIMIT $2
    ))
    RETURNING 1
), effects AS (
    DELETE FROM {schema}.applied_effects
    WHERE idempotency_key = ANY(ARRAY(
        SELECT idempotency_key FROM {schema}.applied_effects
        WHERE applied_at < now() - make_interval(secs => $1)
        ORDER BY applied_at
        LIMIT $2
    ))
    RETURNING 1
)
SELECT (SELECT count(*) FROM keys) + (SELECT count(*) FROM effects) AS pruned
