"""Drives the QStash emulator with the official Python client (PyPI `qstash`).

Env: QSTASH_URL, QSTASH_TOKEN, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY.
It serves its own destination on 127.0.0.1 and prints one "ok ..." line per check, then
"PYTHON ALL OK".
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from qstash import QStash, Receiver
from qstash.errors import SignatureError

HITS = []
LOCK = threading.Lock()
# The slow path's deliveries: how many are open at once (the peak), and when each started.
SLOW = {"open": 0, "peak": 0, "starts": []}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8")
        with LOCK:
            HITS.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        if self.path.startswith("/slow"):
            with LOCK:
                SLOW["open"] += 1
                SLOW["peak"] = max(SLOW["peak"], SLOW["open"])
                SLOW["starts"].append(time.monotonic())
            time.sleep(0.25)
            with LOCK:
                SLOW["open"] -= 1
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
        elif self.path.startswith("/fail"):
            self.send_response(489)
            self.send_header("Upstash-NonRetryable-Error", "true")
            self.end_headers()
            self.wfile.write(b"permanent failure")
        else:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def wait_for(what, fn, timeout=10.0):
    end = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.025)


def hit_of(message_id):
    with LOCK:
        return next((h for h in HITS if h["headers"].get("upstash-message-id") == message_id), None)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % server.server_address[1]

    client = QStash(os.environ["QSTASH_TOKEN"], base_url=os.environ["QSTASH_URL"], retry=False)
    receiver = Receiver(os.environ["QSTASH_CURRENT_SIGNING_KEY"], os.environ["QSTASH_NEXT_SIGNING_KEY"])

    ok_url = base + "/ok"
    res = client.message.publish_json(url=ok_url, body={"hello": "python"}, headers={"x-test": "1"}, retries=0)
    assert res.message_id.startswith("msg_"), res
    hit = wait_for("delivery", lambda: hit_of(res.message_id))
    assert hit["body"] == json.dumps({"hello": "python"}), hit["body"]
    assert hit["headers"].get("x-test") == "1", hit["headers"]
    receiver.verify(signature=hit["headers"]["upstash-signature"], body=hit["body"], url=ok_url)
    try:
        receiver.verify(signature=hit["headers"]["upstash-signature"], body=hit["body"] + "x", url=ok_url)
        raise AssertionError("a tampered body verified")
    except SignatureError:
        pass
    print("ok publish_json+receiver", res.message_id, flush=True)

    batch = client.message.batch_json(
        [{"url": base + "/ok?n=1", "body": {"n": 1}}, {"url": base + "/ok?n=2", "body": {"n": 2}}]
    )
    assert len(batch) == 2 and all(b.message_id for b in batch), batch
    wait_for("batch deliveries", lambda: all(hit_of(b.message_id) for b in batch))
    print("ok batch_json", len(batch), flush=True)

    fail_url = base + "/fail"
    failed = client.message.publish_json(url=fail_url, body={"fail": 1}, retries=3)
    entry = wait_for(
        "dlq entry", lambda: next(iter(client.dlq.list(filter={"message_id": failed.message_id}).messages), None)
    )
    assert entry.response_status == 489, entry
    assert entry.url == fail_url, entry.url
    assert entry.body == json.dumps({"fail": 1}), entry.body
    got = client.dlq.get(entry.dlq_id)
    assert got.message_id == failed.message_id, got
    print("ok dlq.list+get", entry.dlq_id, flush=True)

    client.dlq.delete(entry.dlq_id)
    a = client.message.publish_json(url=fail_url, body={"fail": 2}, retries=0)
    b = client.message.publish_json(url=fail_url, body={"fail": 3}, retries=0)

    def both():
        mine = [m for m in client.dlq.list(filter={"url": fail_url}).messages if m.message_id in (a.message_id, b.message_id)]
        return [m.dlq_id for m in mine] if len(mine) == 2 else None

    ids = wait_for("two dlq entries", both)
    assert client.dlq.delete_many(ids) == 2
    assert client.dlq.list().messages == []
    print("ok dlq.delete+delete_many", flush=True)

    logs = client.log.list(filter={"message_id": res.message_id})
    assert any(l.state.value == "DELIVERED" for l in logs.logs), [l.state for l in logs.logs]
    print("ok log.list", flush=True)

    keys = client.signing_key.get()
    assert keys.current == os.environ["QSTASH_CURRENT_SIGNING_KEY"], keys
    rotated = client.signing_key.rotate()
    assert rotated.current == keys.next and rotated.next != keys.next, rotated
    after = client.message.publish(url=ok_url, body="after rotation", content_type="text/plain")
    hit = wait_for("delivery after rotation", lambda: hit_of(after.message_id))
    Receiver(rotated.current, rotated.next).verify(signature=hit["headers"]["upstash-signature"], body=hit["body"], url=ok_url)
    print("ok signing_key.rotate", flush=True)

    slow_url = base + "/slow"
    for i in range(6):
        client.message.publish_json(url=slow_url, body={"i": i}, flow_control={"key": "py-fc", "parallelism": 2})
    info = client.flow_control.get("py-fc")
    assert info.parallelism_max == 2, info
    wait_for("flow-controlled deliveries", lambda: len(SLOW["starts"]) == 6 and SLOW["open"] == 0)
    assert SLOW["peak"] == 2, SLOW["peak"]
    print("ok flow_control parallelism peak=%d" % SLOW["peak"], flush=True)

    with LOCK:
        SLOW["starts"] = []
    for i in range(4):
        client.message.publish_json(
            url=slow_url + "?r=%d" % i, body={"i": i}, flow_control={"key": "py-rate", "rate": 2, "period": 1}
        )
    wait_for("rate-limited deliveries", lambda: len(SLOW["starts"]) == 4, timeout=15.0)
    gap = SLOW["starts"][2] - SLOW["starts"][0]
    assert gap >= 0.9, gap
    print("ok flow_control rate gap=%.3f" % gap, flush=True)

    server.shutdown()
    print("PYTHON ALL OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure to the Rust test
        print("PYTHON FAILED:", repr(e), file=sys.stderr, flush=True)
        raise
