"""What a producer or an operator in Python sees, with azure-storage-queue (Microsoft's official
SDK), following docs/envelope.md only. Run by tests/azure.rs against Azurite.

    azure_sdk.py send QUEUE     sends one job in base64, as Azure Functions' queues hold text;
                                prints its key
    azure_sdk.py read QUEUE     peeks the failure records the worker wrote to a poison queue;
                                prints what it found as JSON
"""

import datetime
import json
import os
import sys
import uuid

from azure.storage.queue import QueueClient, TextBase64EncodePolicy

CONNECTION = os.environ["AZURE_STORAGE_CONNECTION_STRING"]


def send(queue):
    client = QueueClient.from_connection_string(
        CONNECTION, queue, message_encode_policy=TextBase64EncodePolicy()
    )
    body = {
        "v": 1,
        "kind": "ship",
        "key": "ship:parcel=77",
        "provider_key": str(uuid.uuid4()),
        "cap": 5,
        "enqueued_at": datetime.datetime.now(datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "payload": {"parcel": 77},
    }
    client.send_message(json.dumps(body))
    print(json.dumps({"key": body["key"]}))


def read(queue):
    # No decode policy: the worker writes JSON text as it is unless told to use base64.
    client = QueueClient.from_connection_string(CONNECTION, queue)
    found = []
    for message in client.peek_messages(max_messages=32):
        record = json.loads(message.content)
        expected = ["id", "job_id", "kind", "key", "provider_key", "payload", "last_error",
                    "errors", "attempts", "cap", "first_failed_at", "last_failed_at"]
        found.append({
            "marked": record.get("redrive_record") == 1,
            "missing_fields": [f for f in expected if f not in record],
            "id": record.get("id"),
            "kind": record.get("kind"),
            "key": record.get("key"),
            "payload": record.get("payload"),
            "last_error": record.get("last_error"),
            "attempts": record.get("attempts"),
            "errors": len(record.get("errors") or []),
            "failed_at_parses": bool(
                datetime.datetime.fromisoformat(record["last_failed_at"].replace("Z", "+00:00"))
            ),
        })
    print(json.dumps(found))


if __name__ == "__main__":
    {"send": send, "read": read}[sys.argv[1]](sys.argv[2])
