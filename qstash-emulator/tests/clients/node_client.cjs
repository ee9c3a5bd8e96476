// Drives the QStash emulator with the official TypeScript client (@upstash/qstash, through NODE_PATH).
// Env: QSTASH_URL, QSTASH_TOKEN, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY.
// It serves its own destination on 127.0.0.1 and prints one "ok ..." line per check, then "NODE ALL OK".
"use strict";
const http = require("node:http");
const { Client, Receiver } = require("@upstash/qstash");

const env = process.env;
const client = new Client({ baseUrl: env.QSTASH_URL, token: env.QSTASH_TOKEN, retry: false, enableTelemetry: false });
const receiver = new Receiver({
  currentSigningKey: env.QSTASH_CURRENT_SIGNING_KEY,
  nextSigningKey: env.QSTASH_NEXT_SIGNING_KEY,
});

const hits = [];
// The slow path's deliveries: how many are open at once (the peak), and when each started.
const slow = { open: 0, peak: 0, starts: [] };
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    hits.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
    if (req.url.startsWith("/slow")) {
      slow.open += 1;
      slow.peak = Math.max(slow.peak, slow.open);
      slow.starts.push(Date.now());
      setTimeout(() => {
        slow.open -= 1;
        res.writeHead(200);
        res.end("ok");
      }, 250);
    } else if (req.url.startsWith("/fail")) {
      res.writeHead(489, { "Upstash-NonRetryable-Error": "true" });
      res.end("permanent failure");
    } else {
      res.writeHead(200);
      res.end("ok");
    }
  });
});

function assert(cond, msg) {
  if (!cond) throw new Error("assertion failed: " + msg);
}

async function waitFor(what, fn, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function main() {
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const base = `http://127.0.0.1:${server.address().port}`;

  // publishJSON + Receiver.verify on the delivery.
  const okUrl = `${base}/ok`;
  const pub = await client.publishJSON({ url: okUrl, body: { hello: "node" }, headers: { "x-test": "1" }, retries: 0 });
  assert(pub.messageId && pub.messageId.startsWith("msg_"), "messageId " + JSON.stringify(pub));
  const hit = await waitFor("delivery", () => hits.find((h) => h.headers["upstash-message-id"] === pub.messageId));
  assert(hit.body === JSON.stringify({ hello: "node" }), "body " + hit.body);
  assert(hit.headers["x-test"] === "1", "forwarded header");
  assert(hit.headers["content-type"] === "application/json", "content type");
  const valid = await receiver.verify({ signature: hit.headers["upstash-signature"], body: hit.body, url: okUrl });
  assert(valid === true, "signature verifies");
  let rejected = false;
  try {
    await receiver.verify({ signature: hit.headers["upstash-signature"], body: hit.body + "x", url: okUrl });
  } catch (e) {
    rejected = true;
  }
  assert(rejected, "a tampered body is rejected");
  console.log("ok publishJSON+receiver " + pub.messageId);

  // batchJSON.
  const batch = await client.batchJSON([
    { url: `${base}/ok?n=1`, body: { n: 1 } },
    { url: `${base}/ok?n=2`, body: { n: 2 } },
  ]);
  assert(batch.length === 2 && batch.every((b) => b.messageId), "batch " + JSON.stringify(batch));
  await waitFor("batch deliveries", () => batch.every((b) => hits.some((h) => h.headers["upstash-message-id"] === b.messageId)));
  console.log("ok batchJSON " + batch.length);

  // A non-retryable failure lands in the DLQ; list, retry, delete.
  const failUrl = `${base}/fail`;
  const failed = await client.publishJSON({ url: failUrl, body: { fail: 1 }, retries: 3 });
  const first = await waitFor("dlq entry", async () => {
    const res = await client.dlq.listMessages({ filter: { messageId: failed.messageId } });
    return res.messages[0];
  });
  assert(first.responseStatus === 489, "responseStatus " + first.responseStatus);
  assert(first.url === failUrl, "url " + first.url);
  assert(first.body === JSON.stringify({ fail: 1 }), "dlq body " + first.body);
  console.log("ok dlq.listMessages " + first.dlqId);

  const retried = await client.dlq.retry(first.dlqId);
  assert(retried.responses.length === 1 && retried.responses[0].messageId !== failed.messageId, "retry " + JSON.stringify(retried));
  const again = await waitFor("dlq entry of the retried message", async () => {
    const res = await client.dlq.listMessages({ filter: { messageId: retried.responses[0].messageId } });
    return res.messages[0];
  });
  console.log("ok dlq.retry " + retried.responses[0].messageId);

  const one = await client.dlq.delete(again.dlqId);
  assert(one.deleted === 1, "delete one");
  const a = await client.publishJSON({ url: failUrl, body: { fail: 2 }, retries: 0 });
  const b = await client.publishJSON({ url: failUrl, body: { fail: 3 }, retries: 0 });
  const ids = await waitFor("two dlq entries", async () => {
    const res = await client.dlq.listMessages({ filter: { url: failUrl } });
    const mine = res.messages.filter((m) => m.messageId === a.messageId || m.messageId === b.messageId);
    return mine.length === 2 ? mine.map((m) => m.dlqId) : null;
  });
  const many = await client.dlq.delete(ids);
  assert(many.deleted === 2, "delete many " + JSON.stringify(many));
  const left = await client.dlq.listMessages();
  assert(left.messages.length === 0, "dlq empty " + JSON.stringify(left));
  console.log("ok dlq.delete");

  // Logs.
  const logs = await client.logs({ filter: { messageId: pub.messageId } });
  assert(logs.logs.some((l) => l.state === "DELIVERED"), "logs " + JSON.stringify(logs.logs.map((l) => l.state)));
  console.log("ok logs");

  // flowControl: parallelism 2 holds at a slow destination, the key's state reads back.
  const slowUrl = `${base}/slow`;
  const held = [];
  for (let i = 0; i < 6; i++) {
    held.push(await client.publishJSON({ url: slowUrl, body: { i }, flowControl: { key: "node-fc", parallelism: 2 } }));
  }
  const info = await client.flowControl.get("node-fc");
  assert(info.parallelismMax === 2, "flowControl.get " + JSON.stringify(info));
  await waitFor("flow-controlled deliveries", () => slow.starts.length === 6 && slow.open === 0);
  assert(slow.peak === 2, "peak in flight " + slow.peak);
  console.log("ok flowControl parallelism peak=" + slow.peak);

  // flowControl: rate 2 per period "1s": the 3rd start waits for the next window.
  slow.starts = [];
  slow.peak = 0;
  for (let i = 0; i < 4; i++) {
    await client.publishJSON({ url: `${slowUrl}?r=${i}`, body: { i }, flowControl: { key: "node-rate", rate: 2, period: "1s" } });
  }
  await waitFor("rate-limited deliveries", () => slow.starts.length === 4, 15000);
  const gap = slow.starts[2] - slow.starts[0];
  assert(gap >= 900, "the third start came " + gap + " ms after the first");
  console.log("ok flowControl rate gap=" + gap);

  console.log("NODE ALL OK");
}

main()
  .then(() => {
    server.close();
    process.exit(0);
  })
  .catch((e) => {
    console.error("NODE FAILED:", e && e.stack ? e.stack : e);
    process.exit(1);
  });
