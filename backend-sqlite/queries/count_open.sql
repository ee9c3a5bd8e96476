SELECT count(*) FROM redrive_failed_jobs WHERE state = 'open'
