-- Traces: the producer's W3C trace context travels with its job (`NewJob::traceparent`), and a
-- failure record keeps the failing attempt's trace id (`FailureRecord::trace_id`), so that an
-- alert leads to the failing trace. Plain text, whatever cargo features are on: the file never
-- depends on one. Broker records (`redrive_broker_records`) keep theirs in the record's JSON, as
-- every other field.
ALTER TABLE redrive_jobs ADD COLUMN traceparent TEXT;
ALTER TABLE redrive_failed_jobs ADD COLUMN trace_id TEXT;
