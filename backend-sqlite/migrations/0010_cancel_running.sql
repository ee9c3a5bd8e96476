-- A cancel asked of a running job (`Jobs::cancel_job`), in ms: its renewal is refused (the worker
-- stops the handler), and whatever settles it next but a completion or a failure record (a retry,
-- a give-back, the sweep of its lapsed lease) ends it cancelled with the cancel's why and who,
-- kept in `cancel_reason` and `cancelled_by` from the request.
ALTER TABLE redrive_jobs ADD COLUMN cancel_requested_at INTEGER;

-- A key cancelled in the effect ledger (`Ledger::cancel_key`), in ms: a broker's cancel. A begin
-- answers cancelled (the next delivery completes unrun), an extension of a hold answers cancelled
-- (its worker stops the handler), a finish still marks it done (completion wins).
ALTER TABLE redrive_processed_keys ADD COLUMN cancelled_at INTEGER;
ALTER TABLE redrive_processed_keys ADD COLUMN cancel_reason TEXT;
ALTER TABLE redrive_processed_keys ADD COLUMN cancelled_by TEXT;
