-- Every kind that is paused or has limits: read by every worker once a second.
SELECT kind, paused_reason, paused_by, paused_at, probe_at, concurrency, rate_count, rate_per_us,
       key_concurrency, key_rate_count, key_rate_per_us
FROM redrive_flow_kinds
WHERE paused_at IS NOT NULL OR concurrency IS NOT NULL OR rate_count IS NOT NULL
   OR key_concurrency IS NOT NULL OR key_rate_count IS NOT NULL
ORDER BY kind
