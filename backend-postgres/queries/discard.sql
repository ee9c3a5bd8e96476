UPDATE {schema}.failed_jobs
SET state = 'discarded', closed_at = now(), discard_reason = $2, discarded_by = $3
WHERE id = $1 AND state = 'open'
RETURNING id
