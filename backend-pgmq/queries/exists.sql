-- Whether pgmq is installed, and whether it has the queue.
SELECT to_regnamespace('pgmq') IS NOT NULL AS installed,
       to_regclass('pgmq.' || quote_ident('q_' || $1)) IS NOT NULL AS queue
