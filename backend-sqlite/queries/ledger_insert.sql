-- A key's first attempt. ?1 key, ?2 fingerprint, ?3 provider key, ?4 token, ?5 held until.
INSERT INTO redrive_processed_keys (idempotency_key, fingerprint, provider_key, token, held_until)
VALUES (?1, ?2, ?3, ?4, ?5)
