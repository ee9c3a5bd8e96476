"""Signs Standard Webhooks deliveries with the PyPI package `standardwebhooks`, for the inbox's
tests: python webhook_signers.py < cases.json > signatures.json (cases as webhook_signers.mjs)."""
import json
import sys
from datetime import datetime, timezone

from standardwebhooks import Webhook

cases = json.load(sys.stdin)
out = [
    Webhook(c["secret"]).sign(c["id"], datetime.fromtimestamp(c["timestamp"], tz=timezone.utc), c["payload"])
    for c in cases
]
json.dump(out, sys.stdout)
