"""Inngest's official Python SDK against the emulator, in production mode (signatures checked
both ways). `sdk.py serve` serves three functions with Flask and prints their URL; `sdk.py send
'<events JSON>'` sends events with the SDK's client and prints the ids it got back."""

import datetime
import json
import logging
import os
import sys

import flask
import inngest
import inngest.flask
from werkzeug.serving import make_server

client = inngest.Inngest(
    app_id="py-app",
    api_base_url=os.environ["EMULATOR_URL"],
    event_api_base_url=os.environ["EMULATOR_URL"],
    signing_key=os.environ["EMULATOR_SIGNING_KEY"],
    event_key=os.environ["EMULATOR_EVENT_KEY"],
    is_production=True,
    logger=logging.getLogger("sdk"),
)

if sys.argv[1] == "send":
    events = [
        inngest.Event(name=e["name"], data=e.get("data", {}), id=e.get("id", ""))
        for e in json.loads(sys.argv[2])
    ]
    print(json.dumps(client.send_sync(events)))
    sys.exit(0)


def on_failure(ctx: inngest.ContextSync) -> dict:
    data = ctx.event.data
    return {"failed": data["function_id"], "message": data["error"]["message"]}


@client.create_function(fn_id="greet", trigger=inngest.TriggerEvent(event="app/greet"), retries=2)
def greet(ctx: inngest.ContextSync) -> dict:
    shout = ctx.step.run("shout", lambda: ctx.event.data["name"].upper())
    ctx.step.sleep("pause", datetime.timedelta(seconds=1))
    return {"hello": shout}


@client.create_function(
    fn_id="flaky", trigger=inngest.TriggerEvent(event="app/flaky"), retries=2, on_failure=on_failure
)
def flaky(ctx: inngest.ContextSync) -> None:
    raise Exception(f"boom on attempt {ctx.attempt}")


@client.create_function(fn_id="refuse", trigger=inngest.TriggerEvent(event="app/refuse"))
def refuse(ctx: inngest.ContextSync) -> None:
    raise inngest.NonRetriableError("refused for good")


app = flask.Flask(__name__)
inngest.flask.serve(app, client, [greet, flaky, refuse])
server = make_server("127.0.0.1", 0, app, threaded=True)
print(f"http://127.0.0.1:{server.server_port}/api/inngest", flush=True)
server.serve_forever()
