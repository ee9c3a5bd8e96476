-- Whether a message of the queue or its archive holds $1 (a test aid: a purge forgets payloads).
SELECT EXISTS (SELECT 1 FROM pgmq.{queue} WHERE strpos(message::text || coalesce(headers::text, ''), $1) > 0)
    OR EXISTS (SELECT 1 FROM pgmq.{archive} WHERE strpos(message::text || coalesce(headers::text, ''), $1) > 0)
    AS holds
