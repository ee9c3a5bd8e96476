-- Job ?1 was cancelled at ?2 (ms) for why ?3 by ?4: the record it replays, replaying, is closed as
-- discarded with them (its job will never settle it).
UPDATE redrive_failed_jobs
SET state = 'discarded', closed_at = ?2, discard_reason = 'its replayed job was cancelled: ' || ?3, discard_actor = ?4
WHERE job_id = ?1 AND state = 'replaying'
