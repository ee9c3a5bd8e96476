-- Cancel (`Jobs::cancel_job`): who cancelled a job, why and when, kept on the job as a discard is
-- kept on its record. A cancelled job is a finished one ('done', with no result) that never ran:
-- the claim, the order of a key and `prune_done` already treat it right, and the status check
-- stays as it is. Nullable and without a default, so adding them rewrites nothing.
ALTER TABLE {schema}.jobs
    ADD COLUMN cancelled_at  timestamptz,
    ADD COLUMN cancel_reason text,
    ADD COLUMN cancelled_by  text;
