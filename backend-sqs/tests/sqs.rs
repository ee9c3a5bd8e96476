//! What only SQS does: visibility expiring under a running handler, the redrive policy as the
//! safety net, deferral by a copy that keeps its attempts, redrive back, and the start-up checks
//! that refuse a setup that loses data.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use redrive_core::kit::{Claim, Claimed, Kinds};
use redrive_core::{
    Counts, DeadLetter, Enqueue, ErrorKind, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats,
    QueueStatsExt, Replay, ReplayOutcome, RunningWorker, Worker, WorkerConfig,
};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn ship(parcel: u32) -> NewJob {
    NewJob::from_job(&Ship { parcel }).unwrap()
}

type Effects = Arc<Mutex<Vec<(u32, u32)>>>;

fn worker(
    queue: &SqsBackend,
    ledger: &PgBackend,
    config: WorkerConfig,
    took: Duration,
    effects: &Effects,
) -> RunningWorker {
    let effects = Arc::clone(effects);
    Worker::builder(queue.clone(), ledger.clone())
        .config(config)
        .handle::<Ship>(move |job: Ship, ctx: JobContext| {
            let effects = Arc::clone(&effects);
            async move {
                tokio::time::sleep(took).await;
                effects.lock().unwrap().push((job.parcel, ctx.attempt));
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

async fn wait_for(what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn queue_empty(queue: &SqsBackend) -> bool {
    queue.claim(&Kinds::Any, 10, Duration::ZERO, Duration::ZERO).await.unwrap().is_empty()
}

/// The next message, received within `secs` (short polls: moto holds a long poll whole).
async fn next(queue: &SqsBackend, secs: u64) -> Claimed {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let mut got = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap();
        if let Some(claimed) = got.pop() {
            return claimed;
        }
        assert!(tokio::time::Instant::now() < deadline, "no message within {secs} s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visibility_expiring_mid_handler_without_heartbeat_gives_one_effect_and_a_lost_lease() {
    let (queue, ledger) = (common::queue("vis", QueueSetup::default()).await, common::ledger().await);
    queue.enqueue(ship(1)).await.unwrap();
    let effects = Effects::default();
    let config = WorkerConfig {
        lease: Duration::from_secs(1),
        heartbeat: None,
        poll: Duration::from_secs(1),
        ..WorkerConfig::default()
    };
    let w = worker(&queue, &ledger, config, Duration::from_millis(2500), &effects);
    wait_for("the redelivery to be skipped", 30, async || w.stats().skipped == 1).await;
    let stats = w.shutdown().await;
    assert_eq!(effects.lock().unwrap().len(), 1, "one effect although the message came back mid-handler");
    assert!(stats.deferred >= 1, "the redelivery waited for the running attempt: {stats:?}");
    assert_eq!(stats.lease_lost, 1, "the first attempt's late delete is refused: {stats:?}");
    assert!(queue_empty(&queue).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_keeps_a_long_handler_from_being_redelivered() {
    let (queue, ledger) = (common::queue("beat", QueueSetup::default()).await, common::ledger().await);
    queue.enqueue(ship(2)).await.unwrap();
    let effects = Effects::default();
    let config = WorkerConfig {
        lease: Duration::from_secs(1),
        heartbeat: Some(Duration::from_millis(300)),
        poll: Duration::from_secs(1),
        ..WorkerConfig::default()
    };
    let w = worker(&queue, &ledger, config, Duration::from_millis(2500), &effects);
    wait_for("the effect", 30, async || !effects.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = w.shutdown().await;
    assert_eq!((stats.claimed, stats.deferred, stats.lease_lost, stats.succeeded), (1, 0, 0, 1), "{stats:?}");
    assert!(queue_empty(&queue).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_on_the_last_attempt_is_left_to_the_redrive_policy_and_still_reads_as_a_record() {
    let queue = common::queue("crash", QueueSetup { max_receive_count: 2, ..QueueSetup::default() }).await;
    let job = ship(3).with_cap(2);
    queue.enqueue(job.clone()).await.unwrap();
    for attempt in 1..=2 {
        let got = queue.claim(&Kinds::Any, 1, Duration::from_secs(1), Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].job.attempt, attempt);
        // The worker dies: nothing settles the message.
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    // The third receive finds the count at maxReceiveCount: SQS moves the message itself.
    assert!(queue.claim(&Kinds::Any, 1, Duration::from_secs(1), Duration::from_secs(1)).await.unwrap().is_empty());
    let records = queue.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!((&r.key, &r.payload, r.provider_key), (&job.key, &job.payload, job.provider_key));
    assert!(r.last_error.contains("redrive policy"), "{}", r.last_error);
    assert_eq!(r.attempts, 2);
    assert_eq!(queue.count_open().await.unwrap(), 1, "listing did not consume it");

    // No worker wrote it, so none alerted it: the next workers' sweeps do, once between them.
    let ledger = common::ledger().await;
    let alerts = Arc::new(Mutex::new(Vec::new()));
    let start = || {
        let alerts = Arc::clone(&alerts);
        Worker::builder(queue.clone(), ledger.clone())
            .alert_sweep(Duration::from_millis(300))
            .handle::<Ship>(|_job: Ship, _ctx: JobContext| async { Ok::<_, JobError>(()) })
            .alert_fn(move |alert| {
                let alerts = Arc::clone(&alerts);
                async move {
                    alerts.lock().unwrap().push(alert.record.id.clone());
                    Ok(())
                }
            })
            .build()
            .start()
    };
    let (a, b) = (start(), start());
    wait_for("the sweep's alert", 15, async || !alerts.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // several sweeps of both workers
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(*alerts.lock().unwrap(), std::slice::from_ref(&r.id), "one alert for the moved record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_back_sends_a_new_message_and_the_effect_happens_once() {
    let (queue, ledger) = (common::queue("back", QueueSetup::default()).await, common::ledger().await);
    let job = ship(4);
    let first = queue.enqueue(job.clone()).await.unwrap();
    let claimed = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
    let record = queue.dead_letter(&claimed, "carrier rejected the label").await.unwrap().expect("SQS writes it now");
    let outcome = queue.replay(&record.id, "", "ops").await.unwrap();
    let ReplayOutcome::Replayed(new_id) = outcome else { panic!("{outcome:?}") };
    assert_ne!(&new_id, first.id(), "a redrive is a new message");
    queue.replay(&record.id, "", "ops").await.unwrap(); // closed: nothing more is sent
    let effects = Effects::default();
    let w = worker(&queue, &ledger, WorkerConfig::default(), Duration::ZERO, &effects);
    wait_for("the effect", 30, async || !effects.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    w.shutdown().await;
    assert_eq!(*effects.lock().unwrap(), [(4, 1)]);
    assert_eq!(queue.count_open().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_message_comes_back_after_its_delay_with_its_attempt_and_never_reaches_the_redrive_policy() {
    let queue = common::queue("defer", QueueSetup { max_receive_count: 2, ..QueueSetup::default() }).await;
    let job = ship(6).with_cap(2);
    let id = queue.enqueue(job.clone()).await.unwrap().id().clone();
    let mut claimed = next(&queue, 5).await;
    assert_eq!(claimed.job.attempt, 1);
    // More deferrals than maxReceiveCount: were they counted, SQS would move the message.
    for round in 1..=4 {
        queue.defer(&claimed.lease, Duration::from_secs(1)).await.unwrap();
        let deferred = tokio::time::Instant::now();
        assert!(queue_empty(&queue).await, "round {round}: back before its delay");
        let copy = next(&queue, 10).await;
        let waited = deferred.elapsed();
        assert!(waited >= Duration::from_millis(900), "round {round}: back after {waited:?}");
        assert_eq!(copy.job.attempt, 1, "round {round}: a deferral costs no attempt");
        assert_ne!(copy.lease.job_id, claimed.lease.job_id, "round {round}: a deferral sends a copy");
        assert_eq!(copy.job.id, id, "round {round}: of the same job");
        assert_eq!((&copy.job.key, copy.job.provider_key), (&job.key, job.provider_key));
        assert_eq!((&copy.job.payload, copy.job.cap), (&job.payload, job.cap));
        claimed = copy;
    }
    assert_eq!(queue.count_open().await.unwrap(), 0, "no dead letter");
    assert!(queue.list(&FailureQuery::open()).await.unwrap().is_empty());

    // A spent attempt stays spent through a deferral, up to the record.
    queue.retry(&claimed.lease, Duration::ZERO, "carrier busy").await.unwrap();
    let second = next(&queue, 5).await;
    assert_eq!(second.job.attempt, 2);
    queue.defer(&second.lease, Duration::ZERO).await.unwrap();
    let last = next(&queue, 5).await;
    assert_eq!(last.job.attempt, 2, "the retry's attempt is kept, the deferred receive given back");
    let record = queue.dead_letter(&last, "carrier rejected the label").await.unwrap().expect("SQS writes it now");
    assert_eq!((record.attempts, &record.job_id), (2, &id), "the job's id, through deferrals and retries");
    assert_eq!(queue.list(&FailureQuery::open()).await.unwrap()[0].attempts, 2);
    assert_eq!(queue.list(&FailureQuery::by_job(id)).await.unwrap().len(), 1, "found by the id enqueue gave");
    assert!(queue_empty(&queue).await, "the original was deleted with each deferral");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_text_finds_a_payload_on_the_queue_and_in_its_record_until_the_purge() {
    let queue = common::queue("holds", QueueSetup::default()).await;
    let needle = "\"parcel\":7";
    assert!(!queue.holds_text(needle).await.unwrap());
    queue.enqueue(ship(7)).await.unwrap();
    assert!(queue.holds_text(needle).await.unwrap(), "on the source queue");
    let claimed = next(&queue, 5).await;
    assert!(queue.holds_text(needle).await.unwrap(), "held here");
    queue.dead_letter(&claimed, "carrier rejected the label").await.unwrap();
    assert!(queue.holds_text(needle).await.unwrap(), "in the record");
    assert_eq!(queue.purge(Duration::ZERO).await.unwrap(), 1);
    assert!(!queue.holds_text(needle).await.unwrap(), "forgotten");
}

/// A job type that would accept any string payload, under the kind a body that is not an
/// envelope used to be given.
#[derive(Debug, Serialize, Deserialize)]
struct Unknown(String);

impl Job for Unknown {
    const KIND: &'static str = "unknown";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("body", &self.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_an_envelope_is_a_decode_failure_never_handed_to_a_handler() {
    let (queue, ledger) = (common::queue("junk", QueueSetup::default()).await, common::ledger().await);
    let client = common::raw_client().await;
    let body = "<order card=\"4111111111111111\">42</order>";
    client.send_message().queue_url(queue.queue_url()).message_body(body).send().await.unwrap();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&handled);
    let w = Worker::builder(queue.clone(), ledger.clone())
        .handle::<Unknown>(move |job: Unknown, _ctx: JobContext| {
            seen.lock().unwrap().push(job.0);
            async { Ok::<_, JobError>(()) }
        })
        .build()
        .start();
    wait_for("the record", 30, async || queue.count_open().await.unwrap() == 1).await;
    w.shutdown().await;
    assert!(handled.lock().unwrap().is_empty(), "handed to a handler: {:?}", handled.lock().unwrap());
    let r = queue.list(&FailureQuery::open()).await.unwrap().remove(0);
    assert_eq!(r.payload, serde_json::json!(body), "the body is kept for a person to read");
    assert_eq!(r.attempts, 1, "no retries");
    assert!(r.last_error.starts_with("the message body is not a redrive envelope: "), "{}", r.last_error);
    assert!(!r.last_error.contains("4111") && !r.last_error.contains("order"), "{}", r.last_error);
    // Replayed in an envelope, the body would reach a handler as a job.
    assert_eq!(queue.replay(&r.id, "", "ops").await.unwrap_err().kind(), ErrorKind::Decode);
    assert_eq!(queue.count_open().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_read_the_source_queue_until_a_worker_drains_it() {
    let (queue, ledger) = (common::queue("counts", QueueSetup::default()).await, common::ledger().await);
    for parcel in 20..23 {
        queue.enqueue(ship(parcel)).await.unwrap();
    }
    assert_eq!(queued_running(queue.counts().await.unwrap()), (3, 0));
    let held = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap().remove(0);
    assert_eq!(queued_running(queue.counts().await.unwrap()), (2, 1));
    queue.release(&held.lease).await.unwrap();
    let effects = Effects::default();
    let w = worker(&queue, &ledger, WorkerConfig::default(), Duration::ZERO, &effects);
    let drained = queue.wait_until_drained(Duration::from_secs(30)).await.unwrap();
    w.shutdown().await;
    assert!(drained.is_drained(), "{drained:?}");
    assert_eq!(effects.lock().unwrap().len(), 3);
}

/// A source queue made by hand, its redrive policy pointing at its own `-dlq`, with the given
/// retentions in seconds. Returns the source's name.
async fn source_with_dlq(client: &aws_sdk_sqs::Client, label: &str, dlq_retention: &str, retention: &str) -> String {
    let name = common::name(label);
    let dlq = client
        .create_queue()
        .queue_name(format!("{name}-dlq"))
        .attributes(QueueAttributeName::MessageRetentionPeriod, dlq_retention)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let arn = client
        .get_queue_attributes()
        .queue_url(&dlq)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
        .remove(&QueueAttributeName::QueueArn)
        .unwrap();
    let policy = serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 5}).to_string();
    client
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::RedrivePolicy, policy)
        .attributes(QueueAttributeName::MessageRetentionPeriod, retention)
        .send()
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn setups_that_lose_data_are_refused_at_start() {
    let client = common::raw_client().await;
    // No redrive policy at all.
    let plain = common::name("plain");
    client.create_queue().queue_name(&plain).send().await.unwrap();
    let store = common::ledger().await;
    let err = SqsBackend::connect(common::config(&plain), store.clone()).await.unwrap_err();
    assert!(err.kind() == ErrorKind::Config && err.message().contains("redrive policy"), "{err}");

    // A DLQ that forgets sooner than the source, and one that keeps records only as long as the
    // source keeps jobs: a job moved on its last day would vanish with it.
    for (label, dlq_retention) in [("short", "60"), ("equal", "345600")] {
        let name = source_with_dlq(&client, label, dlq_retention, "345600").await;
        let err = SqsBackend::connect(common::config(&name), store.clone()).await.unwrap_err();
        assert!(err.kind() == ErrorKind::Config && err.message().contains("not longer than the source"), "{err}");
    }

    // Setup leaves the DLQ room to keep records longer, or refuses.
    let max = QueueSetup { retention: Duration::from_secs(14 * 24 * 3600), ..QueueSetup::default() };
    let err = SqsBackend::setup(common::config(&common::name("max")), max, store.clone()).await.unwrap_err();
    assert!(err.kind() == ErrorKind::Config && err.message().contains("14"), "{err}");

    // A cap above maxReceiveCount is refused at enqueue, before anything is sent.
    let queue = common::queue("cap", QueueSetup { max_receive_count: 3, ..QueueSetup::default() }).await;
    let err = queue.enqueue(ship(5).with_cap(4)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(queue_empty(&queue).await);

    // Names SQS would refuse.
    let err = SqsBackend::connect(common::config("no spaces allowed"), store.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);

    // A record store that was never migrated.
    let unmigrated =
        PgBackend::connect(PgConfig::new(common::database_url()).with_schema("rdt_never_migrated")).await.unwrap();
    let err = SqsBackend::setup(common::config(&common::name("nostore")), QueueSetup::default(), unmigrated)
        .await
        .unwrap_err();
    assert!(err.message().contains("migrated"), "{err}");
}

/// A handler that always fails for good with a long error full of control characters.
fn failing_worker(queue: &SqsBackend, ledger: &PgBackend, error: String, alerts: &Arc<Mutex<u32>>) -> RunningWorker {
    let alerts = Arc::clone(alerts);
    let config = WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() };
    Worker::builder(queue.clone(), ledger.clone())
        .config(config)
        .handle::<Blob>(move |_job: Blob, _ctx: JobContext| {
            let error = error.clone();
            async move { Err::<(), _>(JobError::permanent(error)) }
        })
        .alert_fn(move |_alert| {
            let alerts = Arc::clone(&alerts);
            async move {
                *alerts.lock().unwrap() += 1;
                Ok(())
            }
        })
        .build()
        .start()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blob {
    id: u32,
    data: String,
}

impl Job for Blob {
    const KIND: &'static str = "blob";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("id", self.id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_at_the_size_limit_failing_with_a_long_error_full_of_escapes_leaves_one_readable_record() {
    use redrive_core::kit::Backend;
    let queue = common::queue("limit", QueueSetup::default()).await;
    let ledger = common::ledger().await;
    // The largest payload enqueue takes, less 100 bytes.
    let limit = queue.capabilities().max_payload;
    let empty = NewJob::from_job(&Blob { id: 1, data: String::new() }).unwrap();
    let overhead = redrive_core::kit::Envelope::new(&empty).encode().len() + 200;
    let job = NewJob::from_job(&Blob { id: 1, data: "x".repeat(limit - 100 - overhead) }).unwrap();
    queue.enqueue(job.clone()).await.unwrap();
    let too_big = NewJob::from_job(&Blob { id: 2, data: "x".repeat(limit) }).unwrap();
    assert_eq!(queue.enqueue(too_big).await.unwrap_err().kind(), ErrorKind::PayloadTooLarge);

    // 5 KiB of error with ESC and form feed, which SQS refuses in an attribute value.
    let error = format!("card declined \u{1b}[31m\u{c}{}", "e".repeat(5 * 1024));
    let alerts = Arc::new(Mutex::new(0));
    let w = failing_worker(&queue, &ledger, error, &alerts);
    wait_for("the failure record", 30, async || queue.count_open().await.unwrap() >= 1).await;
    wait_for("its alert", 10, async || *alerts.lock().unwrap() >= 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.shutdown().await;
    let records = queue.list(&FailureQuery::open()).await.unwrap();
    assert_eq!((records.len(), *alerts.lock().unwrap()), (1, 1), "one record, one alert");
    let record = &records[0];
    assert_eq!(record.payload, job.payload, "the record keeps the whole payload");
    assert!(record.last_error.starts_with("card declined \\u{1b}[31m\\u{c}"), "{}", &record.last_error[..40]);
    assert!(!record.last_error.contains('\u{1b}') && record.last_error.len() <= 4096);

    // The replay sends one message, and the job runs from it.
    assert!(matches!(queue.replay(&record.id, "", "ops").await.unwrap(), ReplayOutcome::Replayed(_)));
    let replayed = next(&queue, 10).await;
    assert_eq!(replayed.job.payload, job.payload);
    queue.complete(&replayed.lease, None).await.unwrap();
    assert!(queue_empty(&queue).await, "exactly one message was sent");
    assert_eq!(queue.count_open().await.unwrap(), 0);
}

/// Runs `tests/boto3_envelope.py` with boto3, the official AWS SDK for Python (moto's venv has it:
/// `scripts/services env` names it), and reads what it prints.
fn boto3(args: &[&str]) -> serde_json::Value {
    let python = std::env::var("REDRIVE_BOTO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/boto3_envelope.py"))
        .args(args)
        .env("REDRIVE_SQS_ENDPOINT", common::endpoint())
        .output()
        .unwrap_or_else(|e| panic!("boto3's Python ({python}) is required (run scripts/test): {e}"));
    assert!(out.status.success(), "boto3 failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_reads_the_records_a_worker_writes_and_sends_jobs_a_worker_runs_as_envelope_md_says() {
    let name = common::name("boto3");
    let ledger = common::ledger().await;
    let store = redrive_conformance::FlakyStore::new(ledger.clone());
    let queue = SqsBackend::setup(common::config(&name), QueueSetup::default(), store.clone()).await.unwrap();
    let client = common::raw_client().await;
    let dlq = client.get_queue_url().queue_name(format!("{name}-dlq")).send().await.unwrap().queue_url.unwrap();

    // A job sent by Python, from the documentation alone, runs in the Rust worker.
    let sent = boto3(&["send", queue.queue_url()]);
    let effects: Effects = Arc::default();
    let w = worker(
        &queue,
        &ledger,
        WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() },
        Duration::ZERO,
        &effects,
    );
    wait_for("the Python job to run", 20, async || !effects.lock().unwrap().is_empty()).await;
    w.shutdown().await;
    assert_eq!(*effects.lock().unwrap(), [(77, 1)]);
    assert_eq!(sent["key"], "ship:parcel=77");

    // With the record store down, the worker writes the record to the DLQ, where it reads in
    // Python as the documentation says.
    store.set_down(true);
    queue.enqueue(NewJob::from_job(&Blob { id: 5, data: "kept for a replay".into() }).unwrap()).await.unwrap();
    let alerts = Arc::new(Mutex::new(0));
    let w = failing_worker(&queue, &ledger, "card declined".into(), &alerts);
    wait_for("the failure record's alert", 20, async || *alerts.lock().unwrap() >= 1).await;
    w.shutdown().await;
    let records = boto3(&["read", &dlq]);
    let record = &records[0];
    assert_eq!(records.as_array().map(Vec::len), Some(1), "{records}");
    assert_eq!(record["missing_fields"], serde_json::json!([]), "{record}");
    assert_eq!((&record["v"], &record["kind"], &record["key"]), (&1.into(), &"blob".into(), &"blob:id=5".into()));
    assert_eq!(record["payload"], serde_json::json!({"id": 5, "data": "kept for a replay"}));
    assert_eq!(record["attributes_agree"], true, "{record}");
    assert_eq!((&record["error"], &record["attempts"]), (&"card declined".into(), &1.into()));
    assert_eq!(record["failed_at_parses"], true);
    let source_id = record["source_id"].as_str().expect("a source id").to_owned();

    // The store back, the record is drained into it: the same record, alerted once.
    store.set_down(false);
    let kept = queue.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].id.0.as_str(), kept[0].last_error.as_str()), (source_id.as_str(), "card declined"));
    assert_eq!(kept[0].payload, serde_json::json!({"id": 5, "data": "kept for a replay"}));
    assert_eq!(boto3(&["read", &dlq]), serde_json::json!([]), "drained from the DLQ");
    let w = failing_worker(&queue, &ledger, "card declined".into(), &alerts);
    tokio::time::sleep(Duration::from_secs(2)).await; // the new worker's alert sweep
    w.shutdown().await;
    assert_eq!(*alerts.lock().unwrap(), 1, "the drained record was alerted already");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_fifo_a_copy_is_dropped_and_a_conflicting_payload_becomes_a_record_not_a_silent_drop() {
    let queue = common::queue("fifo", QueueSetup { fifo: true, ..QueueSetup::default() }).await;
    let ledger = common::ledger().await;
    let key = redrive_core::IdempotencyKey::builder("ship").fact("parcel", 9).build().unwrap();
    let first = NewJob::new("ship", key.clone(), serde_json::json!({"parcel": 9})).unwrap();
    let other = NewJob::new("ship", key, serde_json::json!({"parcel": 9, "note": "another address"})).unwrap();
    queue.enqueue(first.clone()).await.unwrap();
    queue.enqueue(first.clone()).await.unwrap(); // within SQS's five minutes: dropped
    queue.enqueue(other.clone()).await.unwrap();
    let effects: Effects = Arc::default();
    let config = WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() };
    let w = worker(&queue, &ledger, config, Duration::ZERO, &effects);
    wait_for("the conflict's record", 20, async || queue.count_open().await.unwrap() >= 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.shutdown().await;
    assert_eq!(*effects.lock().unwrap(), [(9, 1)], "the first payload's effect, once");
    let records = queue.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].last_error.contains("different payload"), "{}", records[0].last_error);
    // SQS delivers a group in order (the first payload wins); moto may not: either way the one
    // that lost is kept, never dropped.
    assert!([&first.payload, &other.payload].contains(&&records[0].payload), "the record holds a payload that lost");
}
fn queued_running(counts: Counts) -> (u64, u64) {
    (counts.queued, counts.running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_job_is_sent_delayed_so_no_receive_sees_it_before_its_time() {
    use redrive_core::EnqueueExt;
    use redrive_core::kit::Backend;
    let (queue, ledger) = (common::queue("delay", QueueSetup::default()).await, common::ledger().await);
    assert_eq!(queue.capabilities().max_delay, Some(Duration::from_secs(900)), "SQS holds a job 15 minutes");
    let asked = tokio::time::Instant::now();
    let delay = Duration::from_secs(3);
    // One alone, one in a batch beside a job due now, and one past SQS's 15 minutes (sent with
    // the most SQS takes, which refuses more).
    queue.enqueue_in(ship(30), delay).await.unwrap();
    let batch = vec![ship(31), ship(32).run_in(delay)];
    queue.enqueue_batch(batch).await.unwrap();
    queue.enqueue_in(ship(33), Duration::from_secs(20 * 60)).await.unwrap();
    let counts = queue.counts().await.unwrap();
    assert_eq!((counts.queued, counts.scheduled), (4, Some(3)), "SQS counts the delayed ones: {counts:?}");

    // Only the job due now is received; the others are not received at all, so never deferred.
    let due = next(&queue, 5).await;
    assert_eq!((due.job.key.as_str(), due.job.attempt), ("ship:parcel=31", 1));
    queue.complete(&due.lease, None).await.unwrap();
    while asked.elapsed() + Duration::from_millis(1500) < delay {
        let early = queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(500)).await.unwrap();
        assert!(early.is_empty(), "received {:?} after {:?}", early[0].job.key, asked.elapsed());
    }

    let effects = Effects::default();
    let config = WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() };
    let w = worker(&queue, &ledger, config, Duration::ZERO, &effects);
    wait_for("the scheduled effects", 20, async || effects.lock().unwrap().len() >= 2).await;
    let took = asked.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = w.shutdown().await;
    assert!(took >= delay, "ran {took:?} after enqueue, asked {delay:?}");
    let mut ran = effects.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, [(30, 1), (32, 1)], "each once, on its first attempt");
    assert_eq!((stats.claimed, stats.deferred), (2, 0), "received when due, not early: {stats:?}");
    assert_eq!(queue.counts().await.unwrap().scheduled, Some(1), "the one past 15 minutes still waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_job_received_early_is_put_back_until_its_time_at_no_attempts_cost() {
    let (queue, ledger) = (common::queue("early", QueueSetup::default()).await, common::ledger().await);
    // A producer that sends no delay (or a clock ahead of the worker's): the job comes at once.
    let delay = Duration::from_secs(3);
    let body = redrive_core::kit::Envelope::new(&ship(34).run_in(delay)).encode();
    let asked = tokio::time::Instant::now();
    let client = common::raw_client().await;
    client.send_message().queue_url(queue.queue_url()).message_body(body).send().await.unwrap();
    let effects = Effects::default();
    let config = WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() };
    let w = worker(&queue, &ledger, config, Duration::ZERO, &effects);
    wait_for("the effect", 20, async || !effects.lock().unwrap().is_empty()).await;
    let took = asked.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = w.shutdown().await;
    assert!(took >= delay, "ran {took:?} after enqueue, asked {delay:?}");
    assert_eq!(*effects.lock().unwrap(), [(34, 1)], "once, on its first attempt");
    assert!(stats.deferred >= 1, "received early and put back: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_fifo_a_scheduled_job_is_sent_without_a_delay_and_waits_in_the_worker() {
    use redrive_core::EnqueueExt;
    use redrive_core::kit::Backend;
    let queue = common::queue("fifodelay", QueueSetup { fifo: true, ..QueueSetup::default() }).await;
    let ledger = common::ledger().await;
    assert_eq!(queue.capabilities().max_delay, None, "FIFO queues refuse a per-message delay");
    let delay = Duration::from_secs(2);
    let asked = tokio::time::Instant::now();
    queue.enqueue_in(ship(35), delay).await.unwrap();
    queue.enqueue_batch(vec![ship(36).run_in(delay)]).await.unwrap();
    let effects = Effects::default();
    let config = WorkerConfig { poll: Duration::from_millis(200), ..WorkerConfig::default() };
    let w = worker(&queue, &ledger, config, Duration::ZERO, &effects);
    wait_for("the effects", 30, async || effects.lock().unwrap().len() >= 2).await;
    let took = asked.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = w.shutdown().await;
    assert!(took >= delay, "ran {took:?} after enqueue, asked {delay:?}");
    let mut ran: Vec<u32> = effects.lock().unwrap().iter().map(|&(parcel, _)| parcel).collect();
    ran.sort_unstable();
    assert_eq!(ran, [35, 36], "each once");
    assert!(stats.deferred >= 2, "received early and put back by the worker: {stats:?}");
}
