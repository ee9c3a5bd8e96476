-- Done, each job of the JSON array ?1 of [id, lease token] pairs that its token still holds. ?2
-- now. One statement for the whole group: the jobs returned are done (the rest had lost their
-- lease), with whether each had an order key (the next job of the key may be claimed now) and the
-- record it replays, if any (confirmed with it).
UPDATE redrive_jobs
SET status = 'done', lease_token = NULL, lease_expires = NULL, errors = '[]', done_at = ?2
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token FROM json_each(?1)) AS held
WHERE redrive_jobs.id = held.id AND redrive_jobs.lease_token = held.token
RETURNING redrive_jobs.id AS id, order_key IS NOT NULL AS ordered, replay_of
