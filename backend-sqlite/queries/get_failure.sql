SELECT * FROM redrive_failed_jobs WHERE id = ?1
