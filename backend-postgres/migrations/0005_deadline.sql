-- A job may carry a deadline: claimed after it, it is dropped unrun. Nullable and without a
-- default, so adding it rewrites nothing.
ALTER TABLE {schema}.jobs ADD COLUMN deadline timestamptz;
