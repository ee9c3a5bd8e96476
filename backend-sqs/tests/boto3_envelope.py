"""What a producer or an operator in Python sees, with boto3 (the official AWS SDK), following
docs/envelope.md only. Run by tests/sqs.rs against moto.

    boto3_envelope.py send QUEUE_URL   sends one job as docs/envelope.md says; prints its key
    boto3_envelope.py read DLQ_URL     reads the failure records; prints what it found as JSON
"""

import datetime
import json
import os
import sys
import uuid

import boto3

sqs = boto3.client(
    "sqs",
    endpoint_url=os.environ["REDRIVE_SQS_ENDPOINT"],
    region_name=os.environ.get("AWS_REGION", "us-east-1"),
    aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
    aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
)


def send(url):
    key = "ship:parcel=77"
    provider_key = str(uuid.uuid4())
    body = {
        "v": 1,
        "kind": "ship",
        "key": key,
        "provider_key": provider_key,
        "cap": 3,
        "severity": "error",
        "enqueued_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        "payload": {"parcel": 77},
    }
    attributes = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in [("redrive-kind", "ship"), ("redrive-key", key), ("redrive-provider-key", provider_key)]
    }
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body, separators=(",", ":")), MessageAttributes=attributes)
    print(json.dumps({"key": key, "provider_key": provider_key}))


def read(url):
    # Visibility 0: reading records must not hide them from anyone.
    out = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, MessageAttributeNames=["All"]
    )
    records = []
    for message in out.get("Messages", []):
        body = json.loads(message["Body"])
        attrs = {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}
        missing = [f for f in ("v", "kind", "key", "provider_key", "cap", "enqueued_at", "payload") if f not in body]
        records.append(
            {
                "missing_fields": missing,
                "v": body.get("v"),
                "kind": body.get("kind"),
                "key": body.get("key"),
                "payload": body.get("payload"),
                "attributes_agree": attrs.get("redrive-kind") == body.get("kind")
                and attrs.get("redrive-key") == body.get("key")
                and attrs.get("redrive-provider-key") == body.get("provider_key"),
                "error": attrs.get("redrive-error"),
                "attempts": int(attrs["redrive-attempts"]) if "redrive-attempts" in attrs else None,
                "failed_at_parses": bool(
                    datetime.datetime.fromisoformat(attrs["redrive-failed-at"].replace("Z", "+00:00"))
                ),
                "source_id": attrs.get("redrive-source-id"),
            }
        )
    print(json.dumps(records))


{"send": send, "read": read}[sys.argv[1]](sys.argv[2])
