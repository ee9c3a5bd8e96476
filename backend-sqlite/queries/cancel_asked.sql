-- Whether ?2, not renewed, still holds job ?1 with a cancel asked of it: a row if so (its worker
-- stops the handler); none if the lease is lost.
SELECT id FROM redrive_jobs WHERE id = ?1 AND lease_token = ?2 AND cancel_requested_at IS NOT NULL
