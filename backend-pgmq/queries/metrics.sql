-- pgmq's metrics: every message, the visible ones, and the oldest's age; exact.
SELECT queue_length, queue_visible_length, oldest_msg_age_sec FROM pgmq.metrics($1)
