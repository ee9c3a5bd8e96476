-- Record ?1's alert keys (`redrive_alert:record=<id>:…`), in the ledger beside the effects.
DELETE FROM redrive_processed_keys
WHERE idempotency_key >= 'redrive_alert:record=' || ?1 || ':'
  AND idempotency_key < 'redrive_alert:record=' || ?1 || ';'
