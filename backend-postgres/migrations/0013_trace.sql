-- Traces: the producer's W3C trace context travels with its job (`NewJob::traceparent`), and a
-- failure record keeps the failing attempt's trace id (`FailureRecord::trace_id`), so that an
-- alert leads to the failing trace. Plain text, whatever cargo features are on: the schema never
-- depends on one. Nullable without a default, so adding the columns rewrites nothing. Broker
-- records (`broker_records`) keep theirs in the record's JSON, as every other field.
ALTER TABLE {schema}.jobs ADD COLUMN traceparent text;
ALTER TABLE {schema}.failed_jobs ADD COLUMN trace_id text;
