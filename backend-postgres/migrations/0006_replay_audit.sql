-- A replay keeps who asked for it and why, as a discard does. Nullable and without a default, so
-- adding them rewrites nothing; records replayed before this read with neither.
ALTER TABLE {schema}.failed_jobs ADD COLUMN replayed_by text, ADD COLUMN replay_reason text;
