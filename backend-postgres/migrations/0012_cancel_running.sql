-- A cancel asked of a running job (`Jobs::cancel_job`): its renewal is refused (the worker stops
-- the handler), and whatever settles it next but a completion or a failure record (a retry, a
-- release, the sweep of its lapsed lease) ends it cancelled with the cancel's why and who, kept
-- in `cancel_reason` and `cancelled_by` from the request. Nullable, no default: adding it rewrites
-- nothing.
ALTER TABLE {schema}.jobs ADD COLUMN cancel_requested_at timestamptz;

-- A key cancelled in the effect ledger (`Ledger::cancel_key`): a broker's cancel, whose messages
-- cannot be listed or taken out by id. A begin of the key answers cancelled (the next delivery
-- completes unrun), an extension of a hold of it answers cancelled (its worker stops the
-- handler), and a finish still marks it done (completion wins). The key stays taken: it is not
-- pruned with the done keys. Nullable, no default; the check is widened without a rewrite, and
-- validated after (a read of the table, under a lock that lets writes through).
ALTER TABLE {schema}.processed_keys
    ADD COLUMN cancelled_at  timestamptz,
    ADD COLUMN cancel_reason text,
    ADD COLUMN cancelled_by  text;
ALTER TABLE {schema}.processed_keys DROP CONSTRAINT processed_keys_state_check;
ALTER TABLE {schema}.processed_keys ADD CONSTRAINT processed_keys_state_check
    CHECK (state IN ('pending', 'done', 'cancelled')) NOT VALID;
ALTER TABLE {schema}.processed_keys VALIDATE CONSTRAINT processed_keys_state_check;
