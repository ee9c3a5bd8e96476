//! A kind's limits said to QStash as its own flow control (`QStashConfig::with_flow`): the
//! messages carry the headers, each destination its own key, and QStash holds back the
//! deliveries a worker would otherwise defer and publish again. The emulator on loopback,
//! PostgreSQL for the ledger and its flow store.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_core::{EnqueueExt, Flow, Job, JobContext, JobError, KeyBuilder, Limits, NewJob, Rate, WorkerStats};
use redrive_postgres::PgBackend;
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::RunningEmulator;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Serialize, Deserialize)]
struct Charge {
    order: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

/// One app on the emulator's account: its receiver's destination, its ledger with the kinds'
/// limits set, and its backend, which says them to QStash when `mapped`.
struct App {
    backend: QStashBackend,
    ledger: PgBackend,
    destination: String,
}

async fn app(emulator: &RunningEmulator, limits: &[(&str, Limits)], mapped: bool) -> App {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let destination = format!("http://{}/qstash", listener.local_addr().unwrap());
    let ledger = common::ledger().await;
    for (kind, limits) in limits {
        ledger.set_limits(kind, limits, "test").await.unwrap();
    }
    let mut config = QStashConfig::new(common::TOKEN, &destination).with_api_url(emulator.url()).allow_plain_http();
    if mapped {
        config = config.with_flow(ledger.clone());
    }
    let backend = QStashBackend::connect(config, Arc::new(ledger.clone())).await.unwrap();
    let router = axum::Router::new().route("/qstash", backend.receiver());
    tokio::spawn(async move { axum::serve(listener, router).await });
    App { backend, ledger, destination }
}

/// The flow control of the messages published to `destination`, as the emulator's log shows
/// them at creation: (kind, flowControlKey, parallelism, rate, period), one per message.
async fn created(emulator: &RunningEmulator, destination: &str) -> Vec<(String, Value, Value, Value, Value)> {
    let response = reqwest::Client::new()
        .get(format!("{}/v2/logs", emulator.url()))
        .query(&[("url", destination), ("state", "CREATED"), ("count", "1000")])
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .unwrap();
    let log: Value = response.json().await.unwrap();
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let body: Value = serde_json::from_slice(
                &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, e["body"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap();
            let field = |name: &str| e.get(name).cloned().unwrap_or(Value::Null);
            (
                body["kind"].as_str().unwrap().to_owned(),
                field("flowControlKey"),
                field("parallelism"),
                field("rate"),
                field("period"),
            )
        })
        .collect()
}

fn limits(concurrency: Option<u32>, rate: Option<Rate>) -> Limits {
    Limits { concurrency, rate, ..Limits::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_kinds_messages_carry_flow_control_under_a_key_of_their_destination() {
    let emulator = common::emulator().start_local().await.unwrap();
    let sub_second = Rate { count: 5, per: Duration::from_millis(250) };
    let kinds = [
        ("charge", limits(Some(2), Some(Rate::per_minute(10)))),
        ("refund", limits(Some(4), Some(sub_second))),
        ("audit", Limits { key_concurrency: Some(1), ..Limits::default() }),
    ];
    let a = app(&emulator, &kinds, true).await;
    let b = app(&emulator, &[("charge", limits(Some(3), None))], true).await;
    let unmapped = app(&emulator, &kinds, false).await;

    for app in [&a, &b, &unmapped] {
        app.backend.enqueue_job(&Charge { order: 1 }).await.unwrap();
        let batch = [2, 3].map(|order| NewJob::from_job(&Charge { order }).unwrap()).to_vec();
        redrive_core::Enqueue::enqueue_batch(&app.backend, batch).await.unwrap();
        for kind in ["refund", "audit", "grant"] {
            let key = redrive_core::IdempotencyKey::parse(format!("{kind}:1")).unwrap();
            let job = NewJob::new(kind, key, serde_json::json!({})).unwrap();
            redrive_core::Enqueue::enqueue(&app.backend, job).await.unwrap();
        }
    }

    let of = |rows: &[(String, Value, Value, Value, Value)], kind: &str| {
        rows.iter().filter(|r| r.0 == kind).map(|r| (r.1.clone(), r.2.clone(), r.3.clone(), r.4.clone())).collect()
    };
    let seen_a = created(&emulator, &a.destination).await;
    let charges: Vec<_> = of(&seen_a, "charge");
    assert_eq!(charges.len(), 3, "one enqueue and a batch of two");
    let key_a = charges[0].0.clone();
    assert!(key_a.as_str().is_some_and(|k| k.starts_with("redrive-")), "{key_a}");
    for charge in &charges {
        assert_eq!(charge, &(key_a.clone(), 2.into(), 10.into(), 60.into()), "parallelism 2, 10 a minute");
    }
    let refunds: Vec<_> = of(&seen_a, "refund");
    assert_eq!(refunds[0].1, Value::from(4), "the concurrency goes to QStash");
    assert_eq!((refunds[0].2.clone(), refunds[0].3.clone()), (Value::Null, Value::Null), "5/250ms stays with the worker");
    assert_ne!(refunds[0].0, key_a, "one key per kind");
    for kind in ["audit", "grant"] {
        let rows: Vec<_> = of(&seen_a, kind);
        assert_eq!(rows[0].0, Value::Null, "{kind}: no limit QStash holds, no flow control");
    }

    let seen_b = created(&emulator, &b.destination).await;
    let charges_b: Vec<_> = of(&seen_b, "charge");
    assert_eq!(charges_b[0].1, Value::from(3));
    assert_ne!(charges_b[0].0, key_a, "two destinations on one account never share a key");

    let seen_unmapped = created(&emulator, &unmapped.destination).await;
    assert_eq!(seen_unmapped.len(), 6);
    assert!(seen_unmapped.iter().all(|r| r.1.is_null()), "without with_flow the messages are as before");

    // A changed limit reaches the next messages once the few seconds' cache has passed.
    a.ledger.set_limits("charge", &limits(Some(1), None), "test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5200)).await;
    a.backend.enqueue_job(&Charge { order: 4 }).await.unwrap();
    let last = created(&emulator, &a.destination).await;
    let newest: Vec<_> = of(&last, "charge");
    assert!(newest.contains(&(key_a.clone(), 1.into(), Value::Null, Value::Null)), "{newest:?}");
}

/// Runs 16 charges (kind limited to 2 at once, each taking 150 ms) through a worker on `app`:
/// the worker's stats, the most handlers seen running at once, the publish requests made, and
/// how many times each order ran.
async fn run_charges(app: &App) -> (WorkerStats, u32, u64, HashMap<u32, u32>) {
    let runs: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let (running, peak) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (seen, now, most) = (runs.clone(), running.clone(), peak.clone());
    let worker = redrive_core::Worker::builder(app.backend.clone(), app.ledger.clone())
        .concurrency(8)
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            let (seen, now, most) = (seen.clone(), now.clone(), most.clone());
            async move {
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                *seen.lock().unwrap().entry(job.order).or_default() += 1;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .start();
    let before = app.backend.publish_requests();
    for order in 0..16 {
        app.backend.enqueue_job(&Charge { order }).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs.lock().unwrap().len() < 16 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Late duplicates, if any, would show here.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = worker.stats();
    worker.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    (stats, peak.load(Ordering::SeqCst), app.backend.publish_requests() - before, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_limit_at_qstash_a_worker_runs_every_job_once_with_far_fewer_deferrals() {
    let emulator = common::emulator().start_local().await.unwrap();
    let kinds = [("charge", limits(Some(2), None))];
    let unmapped = app(&emulator, &kinds, false).await;
    let mapped = app(&emulator, &kinds, true).await;

    let (without, peak_without, publishes_without, runs_without) = run_charges(&unmapped).await;
    let (with, peak_with, publishes_with, runs_with) = run_charges(&mapped).await;
    eprintln!(
        "without the mapping: {} deferred, {publishes_without} publishes; with it: {} deferred, {publishes_with} publishes",
        without.deferred, with.deferred
    );
    for (runs, peak) in [(&runs_without, peak_without), (&runs_with, peak_with)] {
        assert_eq!(runs.len(), 16, "every job ran");
        assert!(runs.values().all(|n| *n == 1), "each once: {runs:?}");
        assert!(peak <= 2, "the limit held: {peak} at once");
    }
    assert!(without.deferred >= 8, "without the mapping the worker defers what QStash sends at once");
    assert!(
        with.deferred * 4 <= without.deferred,
        "QStash holds back what the worker would defer: {} against {}",
        with.deferred,
        without.deferred
    );
    assert!(publishes_with < publishes_without, "fewer messages published again");
}
