-- Takes up to ?5 ready jobs, highest priority first and oldest first within one, of the kinds in
-- the JSON array ?4 (NULL: any), under
-- lease token ?3 until ?1 + ?2. ?1 now. The attempt is counted here, and the row being its key's
-- ledger entry, the claim takes the key: past the first claim, the effect is resumed.
-- A job with an order key waits while an earlier job of its key (lower id, any kind) is not done:
-- queued (a retry's backoff too), running, or failed with its record open (a discard clears the
-- failed job's order key). The order key is read from redrive_jobs_ready with the candidate, and
-- the check, only for a job that has one, from redrive_jobs_order.
-- The ready index is read at each priority in redrive_priorities, highest first (`IN` on its first
-- column), each range from its oldest job to its first one not yet due: neither scheduled jobs nor,
-- once the batch is full, lower priorities are read. RETURNING gives no order: the caller sorts.
UPDATE redrive_jobs
SET status = 'running', ready_at = NULL, lease_token = ?3, lease_expires = ?1 + ?2, started = 0,
    attempts = attempts + 1, claims = claims + 1
WHERE id IN (
    SELECT id FROM redrive_jobs AS j
    WHERE status = 'queued' AND priority IN (SELECT priority FROM redrive_priorities) AND ready_at <= ?1
      AND (?4 IS NULL OR kind IN (SELECT value FROM json_each(?4)))
      AND (j.order_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM redrive_jobs AS e
          WHERE e.order_key = j.order_key AND e.id < j.id AND e.status <> 'done'
      ))
    ORDER BY priority DESC, ready_at, id
    LIMIT ?5
)
RETURNING id, kind, idempotency_key, provider_key, payload, attempts, claims, cap, severity, created_at, stranded, deadline,
          priority, traceparent
