//! The webhook inbox over a real listener: deliveries signed by the providers' own libraries
//! (Stripe's Node SDK, Octokit for GitHub, Standard Webhooks' npm and PyPI packages, installed by
//! `scripts/services`; a missing one fails the test) accepted, and tampered, stale, wrongly keyed
//! or unsigned ones refused with nothing stored; one event delivered twice at the same instant
//! runs once on memory, Postgres and SQLite; the same id with another body is refused and the
//! first kept.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use redrive_core::kit::{Claim, Ledger};
use redrive_core::{DeadLetter, JobContext, JobError, MemoryBackend, QueueStats, Worker};
use redrive_http::webhook::{Event, GitHub, Inbox, StandardWebhooks, Stripe, WebhookEvent};
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const STRIPE_SECRET: &str = "whsec_endpoint_secret_for_tests";
const STRIPE_OLD_SECRET: &str = "whsec_the_secret_being_rolled_out";
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STANDARD_OLD_SECRET: &str = "whsec_c2Vjb25kIHNlY3JldCBiZWluZyByb2xsZWQgb3V0";

/// The part of a Stripe event these tests read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: Value,
}

impl Event for Payment {
    const KIND: &'static str = "stripe_payment";
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn stripe_event(id: &str, amount: u32) -> String {
    json!({"id": id, "object": "event", "type": "payment_intent.succeeded", "data": {"amount": amount}}).to_string()
}

/// Runs the providers' own libraries (`webhook_signers.mjs`, `webhook_signers.py`) on `cases`.
fn official(program: &str, script: &str, args: &[String], cases: &[Value]) -> Vec<String> {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(program)
        .arg(&script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is required for the official signers (run scripts/services): {e}"));
    child.stdin.take().unwrap().write_all(json!(cases).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{script} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn node_signs(cases: &[Value]) -> Vec<String> {
    let dir = std::env::var("REDRIVE_WEBHOOK_NODE_DIR")
        .expect("REDRIVE_WEBHOOK_NODE_DIR names the providers' npm packages (run scripts/services, then its env)");
    official("node", "webhook_signers.mjs", &[dir], cases)
}

fn python_signs(cases: &[Value]) -> Vec<String> {
    let python = std::env::var("REDRIVE_WEBHOOK_PYTHON")
        .expect("REDRIVE_WEBHOOK_PYTHON names the python with standardwebhooks (run scripts/services, then its env)");
    official(&python, "webhook_signers.py", &[], cases)
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn deliver(url: &str, headers: &[(&str, String)], body: &str) -> StatusCode {
    answered(url, headers, body).await.0
}

/// The answer's status and its JSON body.
async fn answered(url: &str, headers: &[(&str, String)], body: &str) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.body(body.to_owned()).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Asserts a 401 whose reason is the signed timestamp's window, not the signature.
async fn outside_window(url: &str, headers: &[(&str, String)], body: &str) {
    let (status, answer) = answered(url, headers, body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(answer["error"].as_str().unwrap_or_default().contains("window"), "refused for its age: {answer}");
}

async fn queued(queue: &MemoryBackend) -> u64 {
    queue.counts().await.unwrap().queued
}

#[tokio::test]
async fn deliveries_signed_by_the_providers_libraries_are_accepted_and_altered_ones_refused() {
    let queue = MemoryBackend::new();
    let inbox = Inbox::new(queue.clone());
    let app = Router::new()
        .route("/stripe", inbox.endpoint::<Payment>("billing", Stripe::new(STRIPE_SECRET).unwrap()).unwrap())
        .route("/github", inbox.endpoint::<Value>("ci", GitHub::new(GITHUB_SECRET).unwrap()).unwrap())
        .route("/standard", inbox.endpoint::<Value>("mail", StandardWebhooks::new(STANDARD_SECRET).unwrap()).unwrap());
    let url = listen(app).await;
    let (stripe, github, standard) = (format!("{url}/stripe"), format!("{url}/github"), format!("{url}/standard"));
    let (t, stale) = (now(), now() - 600);
    let mut accepted = 0;

    // Stripe, signed by stripe-node's generateTestHeaderString.
    let body = stripe_event("evt_1", 100);
    let roll = stripe_event("evt_roll", 100);
    let signed = node_signs(&[
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": body, "timestamp": t}),
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": body, "timestamp": stale}),
        json!({"lib": "stripe", "secret": "whsec_someone_else", "payload": body, "timestamp": t}),
        json!({"lib": "stripe", "secret": STRIPE_OLD_SECRET, "payload": roll, "timestamp": t}),
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": roll, "timestamp": t}),
    ]);
    let header = |value: &String| vec![("stripe-signature", value.clone())];
    let altered = body.replacen("100", "900", 1);
    assert_eq!(deliver(&stripe, &header(&signed[0]), &altered).await, StatusCode::UNAUTHORIZED, "one byte changed");
    outside_window(&stripe, &header(&signed[1]), &body).await;
    assert_eq!(deliver(&stripe, &header(&signed[2]), &body).await, StatusCode::UNAUTHORIZED, "another secret");
    assert_eq!(deliver(&stripe, &[], &body).await, StatusCode::BAD_REQUEST, "no Stripe-Signature");
    assert_eq!(queued(&queue).await, 0, "nothing refused is stored");
    assert_eq!(deliver(&stripe, &header(&signed[0]), &body).await, StatusCode::OK);
    accepted += 1;
    // A secret roll: Stripe signs with the old and the new secret, one v1 each.
    let both = format!("{},{}", signed[3], signed[4].split_once(',').unwrap().1);
    assert_eq!(deliver(&stripe, &header(&both), &roll).await, StatusCode::OK, "two signatures, one ours");
    accepted += 1;

    // Stripe's retry of one event with another pending_webhooks count: the same event.
    let retry = |pending: u32| {
        json!({"id": "evt_retry", "object": "event", "type": "invoice.paid", "pending_webhooks": pending,
               "data": {"amount": 1}})
        .to_string()
    };
    let signed = node_signs(&[
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": retry(2), "timestamp": t}),
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": retry(1), "timestamp": t}),
    ]);
    assert_eq!(deliver(&stripe, &header(&signed[0]), &retry(2)).await, StatusCode::OK);
    accepted += 1;
    let (status, answer) = answered(&stripe, &header(&signed[1]), &retry(1)).await;
    assert_eq!((status, &answer["duplicate"]), (StatusCode::OK, &json!(true)), "a retry, not another body");

    // GitHub, signed by @octokit/webhooks-methods.
    let push = json!({"ref": "refs/heads/main", "after": "a1b2c3"}).to_string();
    // A webhook left at GitHub's form content type: signed, and still refused (not JSON).
    let form = "payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D";
    let signed = node_signs(&[
        json!({"lib": "github", "secret": GITHUB_SECRET, "payload": push}),
        json!({"lib": "github", "secret": "not the secret", "payload": push}),
        json!({"lib": "github", "secret": GITHUB_SECRET, "payload": form}),
    ]);
    let github_headers = |signature: &String, delivery: &str| {
        vec![
            ("x-hub-signature-256", signature.clone()),
            ("x-github-delivery", delivery.to_owned()),
            ("x-github-event", "push".to_owned()),
        ]
    };
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let altered = push.replacen("main", "mainx", 1);
    assert_eq!(deliver(&github, &github_headers(&signed[0], delivery), &altered).await, StatusCode::UNAUTHORIZED);
    assert_eq!(deliver(&github, &github_headers(&signed[1], delivery), &push).await, StatusCode::UNAUTHORIZED);
    let (status, answer) = answered(&github, &github_headers(&signed[2], "form-guid"), form).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a signed body that is not JSON: {answer}");
    assert!(answer["error"].as_str().unwrap_or_default().contains("not JSON"), "{answer}");
    let unsigned = [("x-github-delivery", delivery.to_owned())];
    assert_eq!(deliver(&github, &unsigned, &push).await, StatusCode::BAD_REQUEST);
    assert_eq!(deliver(&github, &github_headers(&signed[0], delivery), &push).await, StatusCode::OK);
    accepted += 1;
    // The GUID is not signed: the captured delivery resent under a fresh one is the same event.
    let (status, answer) = answered(&github, &github_headers(&signed[0], "a-fresh-guid"), &push).await;
    assert_eq!((status, &answer["duplicate"]), (StatusCode::OK, &json!(true)), "a resend is a duplicate");

    // Standard Webhooks, signed by its npm package and by its PyPI package.
    let mail = json!({"type": "email.delivered", "data": {"to": "a@example.com"}}).to_string();
    let case = |secret: &str, id: &str, timestamp: i64, payload: &str| json!({"lib": "standard", "secret": secret, "id": id, "timestamp": timestamp, "payload": payload});
    let by_node = node_signs(&[
        case(STANDARD_SECRET, "msg_1", t, &mail),
        case(STANDARD_SECRET, "msg_1", stale, &mail),
        case(STANDARD_OLD_SECRET, "msg_1", t, &mail),
        case(STANDARD_OLD_SECRET, "msg_roll", t, &mail),
        case(STANDARD_SECRET, "msg_roll", t, &mail),
    ]);
    let by_python = python_signs(&[case(STANDARD_SECRET, "msg_py", t, &mail)]);
    let std_headers = |id: &str, timestamp: i64, signature: &str| {
        vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", signature.to_owned()),
        ]
    };
    let altered = mail.replacen("a@", "b@", 1);
    assert_eq!(deliver(&standard, &std_headers("msg_1", t, &by_node[0]), &altered).await, StatusCode::UNAUTHORIZED);
    outside_window(&standard, &std_headers("msg_1", stale, &by_node[1]), &mail).await;
    assert_eq!(deliver(&standard, &std_headers("msg_1", t, &by_node[2]), &mail).await, StatusCode::UNAUTHORIZED);
    // The signature of another id, or of the same id at another time, is not this delivery's.
    assert_eq!(deliver(&standard, &std_headers("msg_2", t, &by_node[0]), &mail).await, StatusCode::UNAUTHORIZED);
    let without_signature = [("webhook-id", "msg_1".to_owned()), ("webhook-timestamp", t.to_string())];
    assert_eq!(deliver(&standard, &without_signature, &mail).await, StatusCode::BAD_REQUEST);
    assert_eq!(queued(&queue).await, accepted, "nothing refused is stored");
    assert_eq!(deliver(&standard, &std_headers("msg_1", t, &by_node[0]), &mail).await, StatusCode::OK);
    let roll = format!("{} {}", by_node[3], by_node[4]);
    assert_eq!(deliver(&standard, &std_headers("msg_roll", t, &roll), &mail).await, StatusCode::OK);
    assert_eq!(deliver(&standard, &std_headers("msg_py", t, &by_python[0]), &mail).await, StatusCode::OK);
    accepted += 3;
    // Svix's senders (Resend, Clerk) name the headers svix-*.
    let svix = node_signs(&[case(STANDARD_SECRET, "msg_svix", t, &mail)]);
    let svix_headers =
        [("svix-id", "msg_svix".to_owned()), ("svix-timestamp", t.to_string()), ("svix-signature", svix[0].clone())];
    assert_eq!(deliver(&standard, &svix_headers, &mail).await, StatusCode::OK);
    accepted += 1;

    assert_eq!(queued(&queue).await, accepted, "one job per accepted event");
}

#[tokio::test]
async fn an_endpoint_that_accepts_the_old_secret_too_takes_deliveries_signed_with_either() {
    let queue = MemoryBackend::new();
    let inbox = Inbox::new(queue.clone());
    let stripe = Stripe::new(STRIPE_SECRET).and_then(|s| s.also(STRIPE_OLD_SECRET)).unwrap();
    let url = listen(Router::new().route("/", inbox.endpoint::<Payment>("billing", stripe).unwrap())).await;
    let (old, new) = (stripe_event("evt_old", 1), stripe_event("evt_new", 2));
    let signed = node_signs(&[
        json!({"lib": "stripe", "secret": STRIPE_OLD_SECRET, "payload": old, "timestamp": now()}),
        json!({"lib": "stripe", "secret": STRIPE_SECRET, "payload": new, "timestamp": now()}),
    ]);
    assert_eq!(deliver(&url, &[("stripe-signature", signed[0].clone())], &old).await, StatusCode::OK);
    assert_eq!(deliver(&url, &[("stripe-signature", signed[1].clone())], &new).await, StatusCode::OK);
    assert_eq!(queued(&queue).await, 2);
}

/// Effects the handler made, by event id, with the amount it read.
#[derive(Default)]
struct Effects(Mutex<Vec<(String, u64)>>);

impl Effects {
    fn of(&self, id: &str) -> Vec<u64> {
        self.0.lock().unwrap().iter().filter(|(e, _)| e == id).map(|(_, a)| *a).collect()
    }
}

async fn until(what: &str, done: impl Fn() -> bool) {
    common::until(what, 10, done).await;
}

/// One event delivered twice at the same instant, over a real listener, on `queue`: both
/// answered 200, one job, one effect; the same id with another body refused, the first kept.
async fn twice_at_once<Q>(queue: Q, ledger: impl Ledger + Clone + 'static)
where
    Q: redrive_core::Enqueue + Claim + DeadLetter + QueueStats + Clone + Send + Sync + 'static,
{
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let url = listen(
        Router::new().route("/", Inbox::new(queue.clone()).endpoint::<Payment>("billing", stripe.clone()).unwrap()),
    )
    .await;
    let body = stripe_event("evt_twice", 4200);
    let signature = vec![("stripe-signature", stripe.signature_header(now(), body.as_bytes()))];
    let (first, second) = tokio::join!(answered(&url, &signature, &body), answered(&url, &signature, &body));
    assert_eq!((first.0, second.0), (StatusCode::OK, StatusCode::OK), "both deliveries are answered 2xx");
    let duplicates = [&first.1, &second.1].iter().filter(|a| a["duplicate"] == json!(true)).count();
    assert_eq!(duplicates, 1, "one stored, one answered as its duplicate: {first:?} {second:?}");
    assert_eq!(queue.counts().await.unwrap().queued, 1, "one job for two deliveries");

    let other = stripe_event("evt_twice", 9999);
    let resigned = vec![("stripe-signature", stripe.signature_header(now(), other.as_bytes()))];
    assert_eq!(deliver(&url, &resigned, &other).await, StatusCode::CONFLICT, "the same id with another body");

    let effects = Arc::new(Effects::default());
    let seen = Arc::clone(&effects);
    let worker = Worker::builder(queue.clone(), ledger)
        .handle::<WebhookEvent<Payment>>(move |event: WebhookEvent<Payment>, ctx: JobContext| {
            let seen = Arc::clone(&seen);
            async move {
                assert_eq!(ctx.attempt, 1);
                assert!(ctx.key.as_str().contains("event=evt_twice"), "the key is the event id: {}", ctx.key);
                let amount = event.event.data["amount"].as_u64().ok_or_else(|| JobError::permanent("no amount"))?;
                seen.0.lock().unwrap().push((event.id.clone(), amount));
                Ok::<_, JobError>(format!("payment {} recorded", event.id))
            }
        })
        .build()
        .start();
    until("the event's effect", || !effects.of("evt_twice").is_empty()).await;
    // Another delivery after it ran: answered, not run again.
    let again = vec![("stripe-signature", stripe.signature_header(now(), body.as_bytes()))];
    assert_eq!(deliver(&url, &again, &body).await, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = worker.shutdown().await;
    assert_eq!(effects.of("evt_twice"), vec![4200], "one effect, of the first body");
    assert_eq!((stats.claimed, stats.succeeded, stats.skipped), (1, 1, 0), "one job claimed and run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_delivered_twice_at_once_runs_once_in_memory() {
    let memory = MemoryBackend::new();
    twice_at_once(memory.clone(), memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_delivered_twice_at_once_runs_once_on_postgres() {
    let postgres = common::database("hook").await;
    twice_at_once(postgres.clone(), postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_delivered_twice_at_once_runs_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(dir.path().join("app.db")))
        .await
        .unwrap();
    twice_at_once(sqlite.clone(), sqlite).await;
}

/// A Stripe event as an app reads it, with a field the test's event lacks.
#[derive(Debug, Serialize, Deserialize)]
struct Strict {
    data: StrictData,
}

#[derive(Debug, Serialize, Deserialize)]
struct StrictData {
    amount: u64,
}

impl Event for Strict {
    const KIND: &'static str = "stripe_strict";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_event_the_app_s_type_cannot_read_is_kept_whole_as_a_failure_record() {
    let queue = MemoryBackend::new();
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let url =
        listen(Router::new().route("/", Inbox::new(queue.clone()).endpoint::<Strict>("shop", stripe.clone()).unwrap()))
            .await;
    let body = json!({"id": "evt_new_shape", "type": "charge.updated", "data": {"amount_total": 5}}).to_string();
    let signature = vec![("stripe-signature", stripe.signature_header(now(), body.as_bytes()))];
    assert_eq!(deliver(&url, &signature, &body).await, StatusCode::OK, "verified and stored");
    let ran = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&ran);
    let worker = Worker::builder(queue.clone(), queue.clone())
        .handle::<WebhookEvent<Strict>>(move |_event: WebhookEvent<Strict>, _ctx: JobContext| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(String::new())
            }
        })
        .build()
        .start();
    let mut records = Vec::new();
    for _ in 0..200 {
        records = queue.list(&redrive_core::FailureQuery::open()).await.unwrap();
        if !records.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    worker.shutdown().await;
    assert_eq!(records.len(), 1, "the event is kept as one failure record");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never saw it");
    let record = &records[0];
    assert_eq!(record.payload["event"]["data"]["amount_total"], 5, "the whole event is in the record");
    assert_eq!(record.payload["id"], "evt_new_shape");
    assert!(record.key.as_str().contains("event=evt_new_shape"));
}
