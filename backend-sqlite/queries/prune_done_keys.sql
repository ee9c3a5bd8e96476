-- The ledger entries of jobs done before ?1, up to ?2 of them (then the jobs, prune_done.sql).
DELETE FROM redrive_processed_keys
WHERE idempotency_key IN (
    SELECT idempotency_key FROM redrive_jobs WHERE status = 'done' AND done_at < ?1 ORDER BY done_at LIMIT ?2
)
