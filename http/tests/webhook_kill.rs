//! A worker process killed (SIGKILL) while it handles a webhook event's job, on Postgres and on
//! SQLite: once its lease lapses, the next worker runs the event once, and a redelivery of the
//! event after it is answered without running again.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use redrive_core::kit::{Claim, Ledger};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, JobContext, JobError, Worker};
use redrive_http::webhook::{Event, Inbox, Stripe, WebhookEvent};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const SECRET: &str = "whsec_kill_test";

#[derive(Debug, Serialize, Deserialize)]
struct Refund {
    data: Value,
}

impl Event for Refund {
    const KIND: &'static str = "stripe_refund";
}

fn log_has(path: &Path, line: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.lines().any(|l| l == line))
}

/// The child: a worker whose handler notes that it started, then hangs until it is killed.
async fn hang<Q, L>(queue: Q, ledger: L, log: &Path) -> !
where
    Q: Claim + DeadLetter + Clone + 'static,
    L: Ledger + 'static,
{
    let log = log.to_owned();
    let _worker = Worker::builder(queue, ledger)
        .handle::<WebhookEvent<Refund>>(move |event: WebhookEvent<Refund>, _ctx: JobContext| {
            let log = log.clone();
            async move {
                std::fs::write(&log, format!("started {}\n", event.id)).unwrap();
                tokio::time::sleep(Duration::from_secs(600)).await;
                Ok::<_, JobError>(String::new())
            }
        })
        .lease(Duration::from_secs(2))
        .build()
        .start();
    tokio::time::sleep(Duration::from_secs(600)).await;
    panic!("the child worker should have been killed");
}

/// The parent: receives the event, starts this test again as the child (`test`, with `env`),
/// kills it once its handler runs, then runs the event with a worker of its own.
async fn kill_mid_event<B>(backend: B, test: &str, env: &[(&str, String)])
where
    B: Enqueue + Claim + DeadLetter + Ledger + Clone + Send + Sync + 'static,
{
    let stripe = Stripe::new(SECRET).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app =
        Router::new().route("/", Inbox::new(backend.clone()).endpoint::<Refund>("refunds", stripe.clone()).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let body = json!({"id": "evt_kill", "type": "charge.refunded", "data": {"amount": 700}}).to_string();
    let deliver = || async {
        let signature = stripe.signature_header(chrono::Utc::now().timestamp(), body.as_bytes());
        let client = reqwest::Client::new();
        client.post(&url).header("stripe-signature", signature).body(body.clone()).send().await.unwrap().status()
    };
    assert_eq!(deliver().await, reqwest::StatusCode::OK);

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("child.log");
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.args([test, "--exact", "--nocapture", "--test-threads=1"]).env("REDRIVE_HOOK_LOG", &log);
    for (name, value) in env {
        child.env(name, value);
    }
    let mut child = child.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    common::until("the child to start the event's handler", 30, || log_has(&log, "started evt_kill")).await;
    child.kill().unwrap(); // SIGKILL: no shutdown, no release; the lease lapses
    child.wait().unwrap();

    let effects = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&effects);
    let worker = Worker::builder(backend.clone(), backend.clone())
        // The attempt is 2, or 1 where the kill came before the handler's start was written
        // (SQLite gives back a claim whose handler never started): not asserted.
        .handle::<WebhookEvent<Refund>>(move |event: WebhookEvent<Refund>, _ctx: JobContext| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push((event.id, event.event.data["amount"].as_u64()));
                Ok::<_, JobError>("refunded".to_owned())
            }
        })
        .build()
        .start();
    common::until("the event's effect after the kill", 30, || !effects.lock().unwrap().is_empty()).await;
    assert_eq!(deliver().await, reqwest::StatusCode::OK, "a redelivery after it ran is answered");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let stats = worker.shutdown().await;
    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects, vec![("evt_kill".to_owned(), Some(700))], "one effect, after the kill");
    assert_eq!(stats.succeeded, 1);
    assert!(backend.list(&FailureQuery::open()).await.unwrap().is_empty(), "no failure record");
}

fn child_log() -> Option<std::path::PathBuf> {
    std::env::var_os("REDRIVE_HOOK_LOG").map(Into::into)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_event_on_postgres_leaves_the_event_to_the_next_worker_once() {
    if let (Some(log), Ok(schema)) = (child_log(), std::env::var("REDRIVE_HOOK_SCHEMA")) {
        let backend = common::connect(&schema).await;
        hang(backend.clone(), backend, &log).await;
    }
    let schema = common::unique_schema("hookkill");
    let backend = common::connect(&schema).await;
    backend.migrate().await.unwrap();
    let test = "a_worker_killed_mid_event_on_postgres_leaves_the_event_to_the_next_worker_once";
    kill_mid_event(backend, test, &[("REDRIVE_HOOK_SCHEMA", schema.clone())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_event_on_sqlite_leaves_the_event_to_the_next_worker_once() {
    let open = |path: &Path| redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(path));
    if let (Some(log), Some(file)) = (child_log(), std::env::var_os("REDRIVE_HOOK_SQLITE")) {
        let backend = open(Path::new(&file)).await.unwrap();
        hang(backend.clone(), backend, &log).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    let backend = open(&file).await.unwrap();
    let test = "a_worker_killed_mid_event_on_sqlite_leaves_the_event_to_the_next_worker_once";
    kill_mid_event(backend, test, &[("REDRIVE_HOOK_SQLITE", file.display().to_string())]).await;
}
