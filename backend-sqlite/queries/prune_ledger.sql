-- Up to ?2 ledger rows of keys done before ?1 (other queues' jobs, HTTP requests). Alert keys
-- stay while their record may: pruned, the sweep would alert it again; `purge` removes them.
DELETE FROM redrive_processed_keys
WHERE idempotency_key IN (
    SELECT idempotency_key FROM redrive_processed_keys
    WHERE done_at < ?1 AND idempotency_key NOT LIKE 'redrive\_alert:%' ESCAPE '\'
    ORDER BY done_at
    LIMIT ?2
)
