//! The emulator's behaviours over real HTTP, with an axum destination on 127.0.0.1.

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::{Answer, Destination};
use redrive_qstash_emulator::{Emulator, Error, RateLimit, RunningEmulator};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const TOKEN: &str = "test-token";
const WAIT: Duration = Duration::from_secs(10);

async fn emulator(scale: f64) -> RunningEmulator {
    Emulator::builder()
        .token(TOKEN)
        .signing_keys("sig_current_test_key", "sig_next_test_key")
        .time_scale(scale)
        .start_local()
        .await
        .unwrap()
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(emu: &RunningEmulator) -> Api {
        Api { base: emu.url(), http: reqwest::Client::new() }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base)).bearer_auth(TOKEN)
    }

    async fn publish(&self, dest: &str, headers: &[(&str, &str)], body: &str) -> Value {
        let mut r = self.req(reqwest::Method::POST, &format!("/v2/publish/{dest}")).body(body.to_owned());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.unwrap();
        assert!(resp.status().is_success(), "publish: {}", resp.status());
        resp.json().await.unwrap()
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.req(reqwest::Method::GET, path).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.req(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

#[derive(Debug, serde::Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    exp: u64,
    nbf: u64,
    iat: u64,
    jti: String,
    body: String,
}

fn verify(signature: &str, key: &str) -> Result<Claims, jsonwebtoken::errors::Error> {
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    v.set_issuer(&["Upstash"]);
    v.set_required_spec_claims(&["iss", "sub", "exp", "nbf"]);
    v.validate_nbf = true;
    v.leeway = 0;
    jsonwebtoken::decode::<Claims>(signature, &jsonwebtoken::DecodingKey::from_secret(key.as_bytes())?, &v)
        .map(|d| d.claims)
}

fn body_hash(body: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE.encode(Sha256::digest(body))
}

#[tokio::test]
async fn a_delivery_is_signed_and_carries_the_forwarded_headers() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let url = dest.url("/hook?x=1");
    let body = r#"{"hello":"world"}"#;
    let res = api
        .publish(
            &url,
            &[("Content-Type", "application/json"), ("Upstash-Forward-X-Custom", "abc"), ("X-Not-Forwarded", "no")],
            body,
        )
        .await;
    let id = res["messageId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msg_"), "{id}");
    assert!(res.get("deduplicated").is_none());

    let hits = dest.wait_hits("/hook", 1, WAIT).await;
    assert_eq!(hits.len(), 1);
    let hit = &hits[0];
    assert_eq!(hit.method, "POST");
    assert_eq!(hit.query.as_deref(), Some("x=1"));
    assert_eq!(hit.body.as_ref(), body.as_bytes());
    assert_eq!(hit.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(hit.header("x-custom").as_deref(), Some("abc"));
    assert_eq!(hit.header("x-not-forwarded"), None);
    assert_eq!(hit.header("upstash-message-id").as_deref(), Some(id.as_str()));
    assert_eq!(hit.header("upstash-retried").as_deref(), Some("0"));
    assert!(hit.header("upstash-caller-ip").is_some());

    let sig = hit.header("upstash-signature").unwrap();
    let claims = verify(&sig, "sig_current_test_key").expect("signed with the current key");
    assert_eq!(claims.iss, "Upstash");
    assert_eq!(claims.sub, url);
    assert_eq!(claims.body, body_hash(body.as_bytes()));
    assert!(claims.body.ends_with('='), "padded base64url, as QStash sends: {}", claims.body);
    assert_eq!(claims.exp, claims.nbf + 300);
    assert_eq!(claims.iat, claims.nbf);
    assert!(claims.jti.starts_with("jwt_"));
    assert!(verify(&sig, "sig_next_test_key").is_err(), "not signed with the next key");

    assert!(emu.wait_until(WAIT, |e| e.pending() == 0).await);
    let d = emu.deliveries_of(&id);
    assert_eq!(d.len(), 1);
    assert!(d[0].delivered());
    assert_eq!(emu.publish_requests(), 1);
    emu.shutdown().await;
}

#[tokio::test]
async fn method_and_percent_encoded_destination() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let encoded: String = percent_encode(&dest.url("/put-here"));
    api.publish(&encoded, &[("Upstash-Method", "PUT")], "x").await;
    let hits = dest.wait_hits("/put-here", 1, WAIT).await;
    assert_eq!(hits[0].method, "PUT");
    emu.shutdown().await;
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'.' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test]
async fn failures_are_retried_with_the_scaled_backoff_then_dead_lettered() {
    // Backoff e^(2.5 n) s scaled by 0.005: 61 ms, then 742 ms.
    let emu = emulator(0.005).await;
    let dest = Destination::start().await;
    dest.always("/fail", Answer::status(500).body("boom").header("X-Why", "test"));
    let api = Api::new(&emu);
    let res = api.publish(&dest.url("/fail"), &[("Upstash-Retries", "2")], "payload").await;
    let id = res["messageId"].as_str().unwrap().to_owned();

    assert!(emu.wait_for_dlq(1, WAIT).await, "dead-lettered");
    let hits = dest.hits_on("/fail");
    assert_eq!(hits.len(), 3, "first attempt + 2 retries");
    let retried: Vec<String> = hits.iter().map(|h| h.header("upstash-retried").unwrap()).collect();
    assert_eq!(retried, ["0", "1", "2"]);
    let gap1 = hits[1].at - hits[0].at;
    let gap2 = hits[2].at - hits[1].at;
    assert!(gap1 >= Duration::from_millis(55) && gap1 < Duration::from_millis(1500), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(700) && gap2 < Duration::from_secs(4), "{gap2:?}");

    let (status, list) = api.get("/v2/dlq").await;
    assert_eq!(status, 200);
    let msgs = list["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0];
    assert_eq!(m["messageId"], json!(id));
    assert_eq!(m["url"], json!(dest.url("/fail")));
    assert_eq!(m["method"], json!("POST"));
    assert_eq!(m["body"], json!("payload"));
    assert_eq!(m["maxRetries"], json!(2));
    assert_eq!(m["retried"], json!(2));
    assert_eq!(m["responseStatus"], json!(500));
    assert_eq!(m["responseBody"], json!("boom"));
    assert_eq!(m["responseHeader"]["X-Why"], json!(["test"]));
    assert!(m["dlqId"].as_str().is_some());
    assert!(m["createdAt"].as_u64().is_some());
    assert!(list.get("cursor").is_none());
    emu.shutdown().await;
}

#[tokio::test]
async fn retry_after_is_honoured_unscaled_instead_of_the_backoff() {
    // time_scale 1: without Retry-After the first retry would wait 12 s.
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    dest.script("/limited", vec![Answer::status(429).header("Retry-After", "1")]);
    let api = Api::new(&emu);
    api.publish(&dest.url("/limited"), &[], "x").await;
    let hits = dest.wait_hits("/limited", 2, WAIT).await;
    assert_eq!(hits.len(), 2);
    let gap = hits[1].at - hits[0].at;
    assert!(gap >= Duration::from_millis(950) && gap < Duration::from_secs(5), "{gap:?}");
    assert_eq!(hits[1].header("upstash-retried").as_deref(), Some("1"));
    assert!(emu.wait_until(WAIT, |e| e.pending() == 0).await);
    assert!(emu.dlq_ids().is_empty());
    emu.shutdown().await;
}

#[tokio::test]
async fn a_custom_retry_delay_expression_is_used() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    dest.script("/x", vec![Answer::status(500), Answer::status(500)]);
    let api = Api::new(&emu);
    api.publish(&dest.url("/x"), &[("Upstash-Retry-Delay", "pow(2, retried) * 100")], "x").await;
    let hits = dest.wait_hits("/x", 3, WAIT).await;
    assert_eq!(hits.len(), 3);
    let (g1, g2) = (hits[1].at - hits[0].at, hits[2].at - hits[1].at);
    assert!(g1 >= Duration::from_millis(95) && g1 < Duration::from_secs(2), "{g1:?}");
    assert!(g2 >= Duration::from_millis(195) && g2 < Duration::from_secs(2), "{g2:?}");
    let resp = api
        .req(reqwest::Method::POST, &format!("/v2/publish/{}", dest.url("/x")))
        .header("Upstash-Retry-Delay", "nope(1)")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_489_non_retryable_answer_dead_letters_at_once() {
    let emu = emulator(0.001).await;
    let dest = Destination::start().await;
    dest.always("/permanent", Answer::status(489).header("Upstash-NonRetryable-Error", "true").body("bad input"));
    // 489 without the header is an ordinary failure: retried.
    dest.script("/plain489", vec![Answer::status(489)]);
    let api = Api::new(&emu);
    api.publish(&dest.url("/permanent"), &[("Upstash-Retries", "5")], "x").await;
    api.publish(&dest.url("/plain489"), &[("Upstash-Retries", "5")], "y").await;
    assert!(emu.wait_for_dlq(1, WAIT).await);
    assert_eq!(dest.hits_on("/permanent").len(), 1, "no retry after a non-retryable error");
    assert_eq!(dest.wait_hits("/plain489", 2, WAIT).await.len(), 2);
    let entries = emu.dlq_entries();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["responseStatus"], json!(489));
    assert_eq!(entries[0]["retried"], json!(0));
    assert_eq!(entries[0]["responseBody"], json!("bad input"));
    emu.shutdown().await;
}

#[tokio::test]
async fn the_default_retry_cap_comes_from_max_retries() {
    let emu = Emulator::builder().token(TOKEN).time_scale(0.0).max_retries(1).start_local().await.unwrap();
    let dest = Destination::start().await;
    dest.always("/f", Answer::status(500));
    Api::new(&emu).publish(&dest.url("/f"), &[], "x").await;
    assert!(emu.wait_for_dlq(1, WAIT).await);
    assert_eq!(dest.hits_on("/f").len(), 2);
    assert_eq!(emu.dlq_entries()[0]["maxRetries"], json!(1));
    emu.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_destination_or_a_timeout_is_a_failure() {
    let emu = emulator(0.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    // Nothing listens on port 9 of loopback (discard) in the test environment.
    api.publish("http://127.0.0.1:9/none", &[("Upstash-Retries", "0")], "x").await;
    assert!(emu.wait_for_dlq(1, WAIT).await);
    let e = &emu.dlq_entries()[0];
    assert_eq!(e["responseStatus"], json!(0));
    assert!(e["error"].as_str().unwrap().contains("delivery failed"));
    // A destination slower than Upstash-Timeout.
    let slow = slow_destination().await;
    api.publish(&format!("{slow}/slow"), &[("Upstash-Retries", "0"), ("Upstash-Timeout", "200ms")], "x").await;
    assert!(emu.wait_for_dlq(2, WAIT).await);
    assert!(emu.dlq_entries()[1]["error"].as_str().unwrap().contains("timed out"));
    drop(dest);
    emu.shutdown().await;
}

async fn slow_destination() -> String {
    let app = axum::Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        "late"
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn dedupe_by_id_and_by_content_within_the_window() {
    let emu = Emulator::builder().token(TOKEN).dedupe_window(Duration::from_millis(400)).start_local().await.unwrap();
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let url = dest.url("/d");
    let first = api.publish(&url, &[("Upstash-Deduplication-Id", "k1")], "a").await;
    let second = api.publish(&url, &[("Upstash-Deduplication-Id", "k1")], "b").await;
    assert_eq!(second["messageId"], first["messageId"]);
    assert_eq!(second["deduplicated"], json!(true));
    let other = api.publish(&url, &[("Upstash-Deduplication-Id", "k2")], "a").await;
    assert_ne!(other["messageId"], first["messageId"]);

    let c1 = api.publish(&url, &[("Upstash-Content-Based-Deduplication", "true")], "same").await;
    let c2 = api.publish(&url, &[("Upstash-Content-Based-Deduplication", "true")], "same").await;
    let c3 = api.publish(&url, &[("Upstash-Content-Based-Deduplication", "true")], "different").await;
    assert_eq!(c2["messageId"], c1["messageId"]);
    assert_eq!(c2["deduplicated"], json!(true));
    assert_ne!(c3["messageId"], c1["messageId"]);

    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = api.publish(&url, &[("Upstash-Deduplication-Id", "k1")], "a").await;
    assert_ne!(after["messageId"], first["messageId"], "the window passed");
    assert!(after.get("deduplicated").is_none());
    assert_eq!(dest.wait_hits("/d", 5, WAIT).await.len(), 5);
    assert_eq!(emu.messages_accepted(), 5);
    assert_eq!(emu.publish_requests(), 7);
    emu.shutdown().await;
}

/// Publishes `n` messages that fail at once (no retries) and waits for their DLQ entries.
async fn fill_dlq(emu: &RunningEmulator, api: &Api, dest: &Destination, n: usize) -> Vec<String> {
    dest.always("/dead", Answer::status(500).body("nope"));
    let before = emu.dlq_ids().len();
    let mut ids = Vec::new();
    for i in 0..n {
        let r = api
            .publish(
                &dest.url("/dead"),
                &[("Upstash-Retries", "0"), ("Upstash-Forward-X-N", &i.to_string())],
                &format!("b{i}"),
            )
            .await;
        ids.push(r["messageId"].as_str().unwrap().to_owned());
        // Keep DLQ order = publish order.
        assert!(emu.wait_for_dlq(before + i + 1, WAIT).await);
    }
    ids
}

#[tokio::test]
async fn dlq_list_pages_filters_get_and_delete() {
    let emu = emulator(0.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let ids = fill_dlq(&emu, &api, &dest, 3).await;

    let (_, page1) = api.get("/v2/dlq?count=2").await;
    let msgs = page1["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0]["messageId"], json!(ids[0]));
    assert_eq!(msgs[0]["header"]["X-N"], json!(["0"]));
    let cursor = page1["cursor"].as_str().unwrap();
    let (_, page2) = api.get(&format!("/v2/dlq?count=2&cursor={cursor}")).await;
    assert_eq!(page2["messages"].as_array().unwrap().len(), 1);
    assert_eq!(page2["messages"][0]["messageId"], json!(ids[2]));
    assert!(page2.get("cursor").is_none());

    let (_, latest) = api.get("/v2/dlq?order=latestFirst&count=1").await;
    assert_eq!(latest["messages"][0]["messageId"], json!(ids[2]));
    let (_, latest2) =
        api.get(&format!("/v2/dlq?order=latestFirst&count=5&cursor={}", latest["cursor"].as_str().unwrap())).await;
    assert_eq!(latest2["messages"].as_array().unwrap().len(), 2);
    assert_eq!(latest2["messages"][0]["messageId"], json!(ids[1]));

    let (_, by_id) = api.get(&format!("/v2/dlq?messageId={}", ids[1])).await;
    assert_eq!(by_id["messages"].as_array().unwrap().len(), 1);
    let (_, by_status) = api.get("/v2/dlq?responseStatus=404").await;
    assert!(by_status["messages"].as_array().unwrap().is_empty());
    let (_, by_url) = api.get(&format!("/v2/dlq?url={}", percent_encode(&dest.url("/dead")))).await;
    assert_eq!(by_url["messages"].as_array().unwrap().len(), 3);
    let (_, by_queue) = api.get("/v2/dlq?queueName=nope").await;
    assert!(by_queue["messages"].as_array().unwrap().is_empty());

    let dlq_ids = emu.dlq_ids();
    let (status, one) = api.get(&format!("/v2/dlq/{}", dlq_ids[0])).await;
    assert_eq!(status, 200);
    assert_eq!(one["dlqId"], json!(dlq_ids[0]));
    assert_eq!(one["body"], json!("b0"));

    let (status, _) = api.send(reqwest::Method::DELETE, &format!("/v2/dlq/{}", dlq_ids[0]), None).await;
    assert_eq!(status, 200);
    let (status, err) = api.send(reqwest::Method::DELETE, &format!("/v2/dlq/{}", dlq_ids[0]), None).await;
    assert_eq!(status, 404);
    assert!(err["error"].as_str().is_some());
    let (status, _) = api.get(&format!("/v2/dlq/{}", dlq_ids[0])).await;
    assert_eq!(status, 404);

    // Bulk delete: JSON body form, then query form.
    let (status, res) =
        api.send(reqwest::Method::DELETE, "/v2/dlq", Some(json!({"dlqIds": [dlq_ids[1], "missing"]}))).await;
    assert_eq!(status, 200);
    assert_eq!(res["deleted"], json!(1));
    let (_, res) =
        api.send(reqwest::Method::DELETE, &format!("/v2/dlq?dlqIds={}&dlqIds=missing", dlq_ids[2]), None).await;
    assert_eq!(res["deleted"], json!(1));
    assert!(emu.dlq_ids().is_empty());
    emu.shutdown().await;
}

#[tokio::test]
async fn dlq_retry_single_and_bulk_resend_as_new_messages() {
    let emu = emulator(0.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let ids = fill_dlq(&emu, &api, &dest, 3).await;
    let dlq_ids = emu.dlq_ids();
    // From now on the destination accepts.
    dest.always("/dead", Answer::status(200));

    let (status, res) = api.send(reqwest::Method::POST, &format!("/v2/dlq/retry/{}", dlq_ids[0]), None).await;
    assert_eq!(status, 200);
    let new_id = res["messageId"].as_str().unwrap().to_owned();
    assert_ne!(new_id, ids[0]);
    let hits = dest.wait_hits("/dead", 4, WAIT).await;
    let retry_hit = hits.iter().find(|h| h.header("upstash-message-id").as_deref() == Some(new_id.as_str())).unwrap();
    assert_eq!(retry_hit.header("upstash-retried").as_deref(), Some("0"));
    assert_eq!(retry_hit.body.as_ref(), b"b0");
    assert_eq!(retry_hit.header("x-n").as_deref(), Some("0"), "forwarded headers kept");
    assert_eq!(emu.dlq_ids(), dlq_ids[1..].to_vec());
    let (status, _) = api.send(reqwest::Method::POST, &format!("/v2/dlq/retry/{}", dlq_ids[0]), None).await;
    assert_eq!(status, 404);

    // Bulk retry by repeated query ids (the TypeScript client's form).
    let (status, res) = api
        .send(reqwest::Method::POST, &format!("/v2/dlq/retry?dlqIds={}&dlqIds={}", dlq_ids[1], dlq_ids[2]), None)
        .await;
    assert_eq!(status, 200);
    let responses = res["responses"].as_array().unwrap();
    assert_eq!(responses.len(), 2);
    assert!(responses.iter().all(|r| r["messageId"].as_str().unwrap().starts_with("msg_")));
    assert_eq!(dest.wait_hits("/dead", 6, WAIT).await.len(), 6);
    assert!(emu.dlq_ids().is_empty());

    // Override on retry: Upstash-Retries header; the JSON body form of bulk retry.
    dest.always("/dead", Answer::status(500));
    fill_dlq(&emu, &api, &dest, 1).await;
    let id = emu.dlq_ids()[0].clone();
    let resp = api
        .req(reqwest::Method::POST, "/v2/dlq/retry")
        .header("Upstash-Retries", "1")
        .json(&json!({"dlqIds": [id]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(emu.wait_for_dlq(1, WAIT).await);
    assert_eq!(emu.dlq_entries()[0]["maxRetries"], json!(1));
    assert_eq!(emu.dlq_entries()[0]["retried"], json!(1));
    emu.shutdown().await;
}

#[tokio::test]
async fn keys_and_rotation_sign_later_deliveries_with_the_new_current_key() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let (status, keys) = api.get("/v2/keys").await;
    assert_eq!(status, 200);
    assert_eq!(keys, json!({"current": "sig_current_test_key", "next": "sig_next_test_key"}));

    let (status, rotated) = api.send(reqwest::Method::POST, "/v2/keys/rotate", None).await;
    assert_eq!(status, 200);
    assert_eq!(rotated["current"], json!("sig_next_test_key"));
    let new_next = rotated["next"].as_str().unwrap().to_owned();
    assert!(new_next.starts_with("sig_") && new_next != "sig_next_test_key");
    assert_eq!(emu.current_signing_key(), "sig_next_test_key");
    assert_eq!(emu.next_signing_key(), new_next);

    api.publish(&dest.url("/after"), &[], "body").await;
    let hit = &dest.wait_hits("/after", 1, WAIT).await[0];
    let sig = hit.header("upstash-signature").unwrap();
    assert!(verify(&sig, "sig_next_test_key").is_ok());
    assert!(verify(&sig, "sig_current_test_key").is_err());

    let k = emu.rotate_keys();
    assert_eq!(k.current, new_next);
    api.publish(&dest.url("/after2"), &[], "body").await;
    let hit = &dest.wait_hits("/after2", 1, WAIT).await[0];
    assert!(verify(&hit.header("upstash-signature").unwrap(), &new_next).is_ok());
    emu.shutdown().await;
}

#[tokio::test]
async fn auth_bad_requests_quota_and_rate_limit() {
    let emu = Emulator::builder()
        .token(TOKEN)
        .quota(Some(2))
        .rate_limit(Some(RateLimit { limit: 3, period: Duration::from_secs(60) }))
        .start_local()
        .await
        .unwrap();
    let dest = Destination::start().await;
    let http = reqwest::Client::new();
    let publish_url = format!("{}/v2/publish/{}", emu.url(), dest.url("/q"));

    let r = http.post(&publish_url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.json::<Value>().await.unwrap()["error"].as_str().is_some());
    let r = http.post(&publish_url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http.get(format!("{}/v2/dlq", emu.url())).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(emu.publish_requests(), 0);

    // The token as a query parameter, which is not part of the destination.
    let r = http.post(format!("{publish_url}?qstash_token={TOKEN}")).body("1").send().await.unwrap();
    assert_eq!(r.status(), 201);
    let hit = &dest.wait_hits("/q", 1, WAIT).await[0];
    assert_eq!(hit.query, None);

    let r = http.post(format!("{}/v2/publish/not-a-url", emu.url())).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"].as_str().is_some());

    let r = http.post(&publish_url).bearer_auth(TOKEN).body("2").send().await.unwrap();
    assert_eq!(r.status(), 201);
    let r = http.post(&publish_url).bearer_auth(TOKEN).body("3").send().await.unwrap();
    assert_eq!(r.status(), 412, "quota of 2 messages used up");
    assert!(r.json::<Value>().await.unwrap()["error"].as_str().unwrap().contains("quota"));

    let r = http.post(&publish_url).bearer_auth(TOKEN).body("4").send().await.unwrap();
    assert_eq!(r.status(), 429, "4th request in the window (the 400 counted too)");
    assert_eq!(r.headers()["burst-ratelimit-limit"], "3");
    assert_eq!(r.headers()["burst-ratelimit-remaining"], "0");
    assert!(r.headers().contains_key("burst-ratelimit-reset"));

    let r = http.get(format!("{}/v2/nope", emu.url())).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 404);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_non_loopback_bind_address_is_refused() {
    let err = Emulator::builder().start("0.0.0.0:0".parse().unwrap()).await.unwrap_err();
    assert!(matches!(err, Error::NonLoopback(_)), "{err}");
    assert!(err.to_string().contains("loopback"));
    let ok = Emulator::builder().start("[::1]:0".parse().unwrap()).await;
    if let Ok(emu) = ok {
        assert!(emu.url().starts_with("http://[::1]:"));
        emu.shutdown().await;
    }
}

#[tokio::test]
async fn batch_publishes_each_message() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let (status, res) = api
        .send(
            reqwest::Method::POST,
            "/v2/batch",
            Some(json!([
                {"destination": dest.url("/b1"), "headers": {"Content-Type": "text/plain", "Upstash-Forward-K": "v"}, "body": "one"},
                {"destination": dest.url("/b2"), "body": "two", "queue": null},
                {"destination": dest.url("/b3"), "body": "three", "queue": "bq"},
            ])),
        )
        .await;
    assert_eq!(status, 200);
    let arr = res.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert!(arr.iter().all(|r| r["messageId"].as_str().unwrap().starts_with("msg_")));
    let h1 = &dest.wait_hits("/b1", 1, WAIT).await[0];
    assert_eq!(h1.body.as_ref(), b"one");
    assert_eq!(h1.header("k").as_deref(), Some("v"));
    assert_eq!(h1.header("content-type").as_deref(), Some("text/plain"));
    assert_eq!(dest.wait_hits("/b2", 1, WAIT).await.len(), 1);
    assert_eq!(dest.wait_hits("/b3", 1, WAIT).await.len(), 1);
    let (status, _) =
        api.send(reqwest::Method::POST, "/v2/batch", Some(json!([{"destination": "nope", "body": "x"}]))).await;
    assert_eq!(status, 400);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_queue_delivers_in_order_one_at_a_time() {
    let emu = emulator(0.01).await;
    let dest = Destination::start().await;
    // The first message fails once; the second must wait for it.
    dest.script("/q", vec![Answer::status(500)]);
    let api = Api::new(&emu);
    for i in 0..3 {
        let r = api
            .req(reqwest::Method::POST, &format!("/v2/enqueue/orders/{}", dest.url("/q")))
            .body(format!("m{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let hits = dest.wait_hits("/q", 4, WAIT).await;
    let bodies: Vec<&[u8]> = hits.iter().map(|h| h.body.as_ref()).collect();
    assert_eq!(bodies, [b"m0".as_ref(), b"m0", b"m1", b"m2"]);
    let (status, queues) = api.get("/v2/queues").await;
    assert_eq!(status, 200);
    assert_eq!(queues[0]["name"], json!("orders"));
    assert_eq!(queues[0]["parallelism"], json!(1));

    // Upsert with more parallelism.
    let (status, _) =
        api.send(reqwest::Method::POST, "/v2/queues/", Some(json!({"queueName": "wide", "parallelism": 2}))).await;
    assert_eq!(status, 200);
    let (_, q) = api.get("/v2/queues/wide").await;
    assert_eq!(q["parallelism"], json!(2));
    emu.shutdown().await;
}

#[tokio::test]
async fn messages_can_be_read_and_cancelled_and_logs_show_states() {
    let emu = emulator(1.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    let later = api.publish(&dest.url("/later"), &[("Upstash-Delay", "10s")], "later").await;
    let id = later["messageId"].as_str().unwrap();
    let (status, m) = api.get(&format!("/v2/messages/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(m["messageId"], json!(id));
    assert!(m["notBefore"].as_u64().unwrap() >= m["createdAt"].as_u64().unwrap() + 9_000);
    let (status, _) = api.send(reqwest::Method::DELETE, &format!("/v2/messages/{id}"), None).await;
    assert_eq!(status, 202);
    let (status, _) = api.get(&format!("/v2/messages/{id}")).await;
    assert_eq!(status, 404);

    let now = api.publish(&dest.url("/now"), &[], "now").await;
    let now_id = now["messageId"].as_str().unwrap();
    dest.wait_hits("/now", 1, WAIT).await;
    assert!(emu.wait_until(WAIT, |e| e.pending() == 0).await);
    for path in ["/v2/logs", "/v2/events"] {
        let (status, logs) = api.get(&format!("{path}?messageId={now_id}")).await;
        assert_eq!(status, 200);
        let states: Vec<&str> =
            logs["events"].as_array().unwrap().iter().map(|e| e["state"].as_str().unwrap()).collect();
        assert_eq!(states, ["DELIVERED", "ACTIVE", "CREATED"], "newest first");
        assert_eq!(logs["events"][0]["responseStatus"], json!(200));
    }
    let (_, cancelled) = api.get(&format!("/v2/logs?messageId={id}&state=CANCELED")).await;
    assert_eq!(cancelled["events"].as_array().unwrap().len(), 1);
    let (_, page) = api.get("/v2/logs?count=2").await;
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    let (_, rest) = api.get(&format!("/v2/logs?count=100&cursor={}", page["cursor"].as_str().unwrap())).await;
    assert!(!rest["events"].as_array().unwrap().is_empty());
    assert!(dest.hits_on("/later").is_empty());
    emu.shutdown().await;
}

#[tokio::test]
async fn the_dlq_url_filter_takes_several_urls_and_a_retry_in_the_dedupe_window_sends_nothing() {
    let emu = emulator(0.0).await;
    let dest = Destination::start().await;
    let api = Api::new(&emu);
    for (path, dedupe) in [("/a", "dedupe-a"), ("/b", "dedupe-b"), ("/c", "dedupe-c")] {
        dest.always(path, Answer::status(500));
        api.publish(&dest.url(path), &[("Upstash-Retries", "0"), ("Upstash-Deduplication-Id", dedupe)], "x").await;
    }
    assert!(emu.wait_for_dlq(3, WAIT).await);
    let url = |path: &str| percent_encode(&dest.url(path));
    let (_, two) = api.get(&format!("/v2/dlq?url={}&url={}", url("/a"), url("/b"))).await;
    let urls: Vec<&str> = two["messages"].as_array().unwrap().iter().map(|m| m["url"].as_str().unwrap()).collect();
    assert_eq!(urls, [dest.url("/a"), dest.url("/b")], "any of the urls given, and only those");

    let entries = emu.dlq_entries();
    let (status, again) = api
        .send(reqwest::Method::POST, &format!("/v2/dlq/retry/{}", entries[0]["dlqId"].as_str().unwrap()), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(again["deduplicated"], json!(true), "the retry kept the message's deduplication id");
    assert_eq!(again["messageId"], entries[0]["messageId"], "the earlier message's id");
    assert_eq!(emu.dlq_ids().len(), 2, "the entry left the DLQ");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(dest.hits_on("/a").len(), 1, "nothing was sent again");

    let fresh = api
        .req(reqwest::Method::POST, &format!("/v2/dlq/retry/{}", entries[1]["dlqId"].as_str().unwrap()))
        .header("Upstash-Deduplication-Id", "another")
        .send()
        .await
        .unwrap();
    let fresh: Value = fresh.json().await.unwrap();
    assert!(fresh.get("deduplicated").is_none(), "another deduplication id is sent: {fresh}");
    assert_eq!(dest.wait_hits("/b", 2, WAIT).await.len(), 2);
    emu.shutdown().await;
}
