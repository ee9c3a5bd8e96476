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
        ("payout", limits(None, Some(Rate { count: 3, per: Duration::from_millis(1500) }))),
        ("audit", Limits { key_concurrency: Some(1), ..Limits::default() }),
    ];
    let a = app(&emulator, &kinds, true).await;
    let b = app(&emulator, &[("charge", limits(Some(3), None))], true).await;
    let unmapped = app(&emulator, &kinds, false).await;

    for app in [&a, &b, &unmapped] {
        app.backend.enqueue_job(&Charge { order: 1 }).await.unwrap();
        let batch = [2, 3].map(|order| NewJob::from_job(&Charge { order }).unwrap()).to_vec();
        redrive_core::Enqueue::enqueue_batch(&app.backend, batch).await.unwrap();
        for kind in ["refund", "payout", "audit", "grant"] {
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
    assert_eq!(
        (refunds[0].2.clone(), refunds[0].3.clone()),
        (Value::Null, Value::Null),
        "5/250ms stays with the worker"
    );
    assert_ne!(refunds[0].0, key_a, "one key per kind");
    let payouts: Vec<_> = of(&seen_a, "payout");
    assert_eq!((payouts[0].2.clone(), payouts[0].3.clone()), (3.into(), 2.into()), "3/1500ms: 3 per 2 s, never faster");
    for kind in ["audit", "grant"] {
        let rows: Vec<_> = of(&seen_a, kind);
        assert_eq!(rows[0].0, Value::Null, "{kind}: no limit QStash holds, no flow control");
    }

    let seen_b = created(&emulator, &b.destination).await;
    let charges_b: Vec<_> = of(&seen_b, "charge");
    assert_eq!(charges_b[0].1, Value::from(3));
    assert_ne!(charges_b[0].0, key_a, "two destinations on one account never share a key");

    let seen_unmapped = created(&emulator, &unmapped.destination).await;
    assert_eq!(seen_unmapped.len(), 7);
    assert!(seen_unmapped.iter().all(|r| r.1.is_null()), "without with_flow the messages are as before");

    // A changed limit reaches the next messages once the few seconds' cache has passed.
    a.ledger.set_limits("charge", &limits(Some(1), None), "test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5200)).await;
    a.backend.enqueue_job(&Charge { order: 4 }).await.unwrap();
    let last = created(&emulator, &a.destination).await;
    let newest: Vec<_> = of(&last, "charge");
    assert!(newest.contains(&(key_a.clone(), 1.into(), Value::Null, Value::Null)), "{newest:?}");
}

/// What a run of charges showed.
struct Run {
    stats: WorkerStats,
    /// The most handlers running at once.
    peak: u32,
    /// Publish requests made, enqueues included.
    publishes: u64,
    /// How many times each order ran.
    runs: HashMap<u32, u32>,
    /// When each handler started, in order.
    starts: Vec<Instant>,
}

/// Runs `jobs` charges, each taking `work`, through a worker on `app`.
async fn run_charges(app: &App, jobs: u32, work: Duration) -> Run {
    let runs: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (running, peak) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (seen, now, most, started) = (runs.clone(), running.clone(), peak.clone(), starts.clone());
    let worker = redrive_core::Worker::builder(app.backend.clone(), app.ledger.clone())
        .concurrency(8)
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            let (seen, now, most, started) = (seen.clone(), now.clone(), most.clone(), started.clone());
            async move {
                started.lock().unwrap().push(Instant::now());
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                tokio::time::sleep(work).await;
                now.fetch_sub(1, Ordering::SeqCst);
                *seen.lock().unwrap().entry(job.order).or_default() += 1;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .start();
    let before = app.backend.publish_requests();
    for order in 0..jobs {
        app.backend.enqueue_job(&Charge { order }).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs.lock().unwrap().len() < jobs as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Late duplicates, if any, would show here.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = worker.stats();
    worker.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    let starts = starts.lock().unwrap().clone();
    Run { stats, peak: peak.load(Ordering::SeqCst), publishes: app.backend.publish_requests() - before, runs, starts }
}

fn assert_each_ran_once(run: &Run, jobs: u32) {
    assert_eq!(run.runs.len(), jobs as usize, "every job ran");
    assert!(run.runs.values().all(|n| *n == 1), "each once: {:?}", run.runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_limit_at_qstash_a_worker_runs_every_job_once_with_far_fewer_deferrals() {
    let emulator = common::emulator().start_local().await.unwrap();
    let kinds = [("charge", limits(Some(2), None))];
    let unmapped = app(&emulator, &kinds, false).await;
    let mapped = app(&emulator, &kinds, true).await;

    let without = run_charges(&unmapped, 16, Duration::from_millis(150)).await;
    let with = run_charges(&mapped, 16, Duration::from_millis(150)).await;
    eprintln!(
        "2 at once, 16 jobs of 150 ms: without the mapping {} deferred, {} publishes; with it {} deferred, {} publishes",
        without.stats.deferred, without.publishes, with.stats.deferred, with.publishes
    );
    for run in [&without, &with] {
        assert_each_ran_once(run, 16);
        assert!(run.peak <= 2, "the limit held: {} at once", run.peak);
    }
    assert!(without.stats.deferred >= 8, "without the mapping the worker defers what QStash sends at once");
    assert!(
        with.stats.deferred * 4 <= without.stats.deferred && with.stats.deferred <= 2,
        "QStash holds back what the worker would defer: {} against {}",
        with.stats.deferred,
        without.stats.deferred
    );
    assert!(with.publishes <= 16 + 2, "the enqueues, and next to no copies: {}", with.publishes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_in_whole_seconds_is_kept_by_qstash_before_the_worker_sees_it() {
    let emulator = common::emulator().start_local().await.unwrap();
    let kinds = [("charge", limits(None, Some(Rate::per_second(4))))];
    let unmapped = app(&emulator, &kinds, false).await;
    let mapped = app(&emulator, &kinds, true).await;

    let without = run_charges(&unmapped, 12, Duration::from_millis(10)).await;
    let with = run_charges(&mapped, 12, Duration::from_millis(10)).await;
    eprintln!(
        "4 a second, 12 jobs: without the mapping {} deferred, {} publishes; with it {} deferred, {} publishes",
        without.stats.deferred, without.publishes, with.stats.deferred, with.publishes
    );
    for run in [&without, &with] {
        assert_each_ran_once(run, 12);
        // The worker's rate (a burst of 4, then one every 250 ms) holds either way.
        let span = *run.starts.last().unwrap() - run.starts[0];
        assert!(span >= Duration::from_millis(1700), "12 at 4 a second took {span:?}");
    }
    assert!(without.stats.deferred >= 8, "without the mapping the worker defers the 8 past the burst");
    assert!(
        with.stats.deferred * 2 <= without.stats.deferred,
        "QStash's windows hold back most of what the worker would defer: {} against {}",
        with.stats.deferred,
        without.stats.deferred
    );
}

/// A conformance subject whose backend says the kinds' limits to QStash.
async fn mapped_subject(emulator: &RunningEmulator) -> redrive_conformance::Subject<QStashBackend, PgBackend> {
    let app = app(emulator, &[], true).await;
    let timing = redrive_conformance::Timing {
        lease: Duration::from_secs(1),
        settle: Duration::from_secs(2),
        timeout: Duration::from_secs(60),
    };
    redrive_conformance::Subject::new(app.backend, app.ledger, timing)
}

/// The flow-control scenarios of the conformance suite, on a backend that maps the limits:
/// QStash holding deliveries back never breaks a promise the worker makes (a kind's concurrency
/// and rate, a key's concurrency, a paused kind), and no job waits into a spent attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_scenarios_hold_with_the_limits_at_qstash() {
    let emulator = common::emulator().start_local().await.unwrap();
    redrive_conformance::check(redrive_conformance::kind_concurrency(mapped_subject(&emulator).await).await);
    redrive_conformance::check(redrive_conformance::rate_limited(mapped_subject(&emulator).await).await);
    redrive_conformance::check(redrive_conformance::key_concurrency(mapped_subject(&emulator).await).await);
    redrive_conformance::check(redrive_conformance::paused_kind(mapped_subject(&emulator).await).await);
}

/// A flow store that does not answer (here: a schema never migrated, so every read fails) costs
/// an enqueue nothing but the headers: the job is published as it was before, and the worker,
/// reading its own ledger, keeps the limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_store_that_fails_leaves_the_messages_as_they_were() {
    let emulator = common::emulator().start_local().await.unwrap();
    let broken = redrive_postgres::PgConfig::new(common::database_url())
        .with_schema(format!("rdt_never_migrated_{}", std::process::id()))
        .with_max_connections(1);
    let broken = PgBackend::connect(broken).await.unwrap();
    assert!(Flow::kinds(&broken).await.is_err(), "the store cannot be read");
    let records = common::ledger().await;
    let destination = "http://127.0.0.1:9/qstash";
    let config =
        QStashConfig::new(common::TOKEN, destination).with_api_url(emulator.url()).allow_plain_http().with_flow(broken);
    let backend = QStashBackend::connect(config, Arc::new(records)).await.unwrap();
    let began = Instant::now();
    backend.enqueue_job(&Charge { order: 1 }).await.unwrap();
    backend.enqueue_job(&Charge { order: 2 }).await.unwrap();
    assert!(began.elapsed() < Duration::from_secs(3), "an enqueue does not hang on the store");
    let rows = created(&emulator, destination).await;
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.1.is_null()), "published without flow control");
}
