"""The official Python client of pgmq (PyPI `pgmq`), as another team's producer and reader.

usage: pgmq_client.py DATABASE_URL send QUEUE ENVELOPE_JSON   -> prints the message id
       pgmq_client.py DATABASE_URL records SCHEMA SCOPE       -> prints the open records, JSON
       pgmq_client.py DATABASE_URL archived QUEUE             -> prints the archived messages, JSON
       pgmq_client.py DATABASE_URL metrics QUEUE              -> prints pgmq's metrics, JSON
"""

import json
import sys
from urllib.parse import urlparse

from pgmq import PGMQueue


def main() -> None:
    url, command, *args = sys.argv[1:]
    parts = urlparse(url)
    queue = PGMQueue(
        host=parts.hostname or "127.0.0.1",
        port=str(parts.port or 5432),
        database=parts.path.lstrip("/"),
        username=parts.username or "postgres",
        password=parts.password or "",
        init_extension=False,
    )
    try:
        if command == "send":
            name, envelope = args
            print(queue.send(name, json.loads(envelope)))
        elif command == "records":
            schema, scope = args
            with queue.pool.connection() as conn:
                rows = conn.execute(
                    f'SELECT id, kind, idempotency_key, record::text FROM "{schema}".broker_records '
                    "WHERE queue = %s AND state = 'open' ORDER BY seq",
                    (scope,),
                ).fetchall()
            print(json.dumps([{"id": r[0], "kind": r[1], "key": r[2], "record": json.loads(r[3])} for r in rows]))
        elif command == "archived":
            (name,) = args
            with queue.pool.connection() as conn:
                rows = conn.execute(
                    f"SELECT msg_id, read_ct, message::text, headers::text FROM pgmq.a_{name} ORDER BY msg_id"
                ).fetchall()
            print(json.dumps([
                {"msg_id": r[0], "read_ct": r[1], "message": json.loads(r[2]), "headers": json.loads(r[3] or "null")}
                for r in rows
            ]))
        elif command == "metrics":
            (name,) = args
            m = queue.metrics(name)
            print(json.dumps({"queue_length": m.queue_length, "total_messages": m.total_messages}))
        else:
            raise SystemExit(f"unknown command {command}")
    finally:
        queue.pool.close()


if __name__ == "__main__":
    main()
