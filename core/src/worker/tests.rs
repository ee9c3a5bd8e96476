//! The worker's own tests, on the in-memory backend.
use std::sync::Mutex;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::json;

use super::*;
use crate::alert::BoxFuture;
use crate::backend::{DeadLetter, Enqueue, EnqueueExt, FailureQuery, Ledger};
use crate::error::Error;
use crate::job::NewJob;
use crate::job::{JobContext, JobError};
use crate::key::{IdempotencyKey, KeyBuilder};
use crate::memory::MemoryBackend;

#[derive(Serialize, Deserialize)]
struct Ping {
    n: u32,
}

impl Job for Ping {
    const KIND: &'static str = "ping";
    const CAP: Option<u32> = Some(3);
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

struct FailingSink;

impl AlertSink for FailingSink {
    fn send<'a>(&'a self, _alert: &'a Alert) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async { Err(Error::temporary("webhook down")) })
    }
}

fn fast() -> WorkerConfig {
    WorkerConfig { backoff: Backoff::NONE, poll: Duration::from_millis(50), ..WorkerConfig::default() }
}

/// Waits until the worker has run `n` handlers to success, or `within` has passed.
async fn succeeded(worker: &RunningWorker, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while worker.stats().succeeded < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn records(backend: &MemoryBackend, n: usize) -> Vec<crate::FailureRecord> {
    for _ in 0..200 {
        let list = backend.list(&FailureQuery::open()).await.unwrap();
        if list.len() >= n {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} failure records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_share_slow_jobs_instead_of_one_claiming_them_all() {
    let backend = MemoryBackend::new();
    for n in 0..40 {
        backend.enqueue_job(&Ping { n }).await.unwrap();
    }
    let slow = |_job: Ping, _ctx: JobContext| async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok::<_, JobError>(())
    };
    let config = WorkerConfig { concurrency: 2, ..fast() };
    let start = |backend: &MemoryBackend| {
        Worker::builder(backend.clone(), backend.clone()).config(config.clone()).handle::<Ping>(slow).build().start()
    };
    let first = start(&backend);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = start(&backend);
    let all_done = async {
        while first.stats().succeeded + second.stats().succeeded < 40 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(15), all_done).await.expect("all 40 jobs run");
    let (first, second) = (first.shutdown().await, second.shutdown().await);
    // One worker claiming a full batch would have left the second with nothing to do.
    assert!(second.succeeded >= 10, "the later worker ran {} of 40; the first {}", second.succeeded, first.succeeded);
    assert_eq!(first.handed_back + second.handed_back, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_jobs_are_claimed_for_free_handlers_only_never_to_wait_out_their_claim_lease() {
    let backend = MemoryBackend::new();
    for n in 0..4 {
        backend.enqueue_job(&Ping { n }).await.unwrap();
    }
    let runs = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&runs);
    let config = WorkerConfig {
        concurrency: 1,
        claim_lease: Duration::from_millis(300),
        lease: Duration::from_secs(10),
        ..fast()
    };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ping>(move |_job: Ping, _ctx: JobContext| {
            *counter.lock().unwrap() += 1;
            async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    succeeded(&worker, 4, Duration::from_millis(3000)).await;
    let stats = worker.shutdown().await;
    // A job claimed behind a running 500 ms handler would wait past half its 300 ms claim
    // lease and be handed back, costing a receive on SQS each time.
    assert_eq!((stats.succeeded, stats.claimed, stats.handed_back, *runs.lock().unwrap()), (4, 4, 0, 4));
}

#[tokio::test]
async fn a_worker_claims_only_the_kinds_it_handles() {
    use crate::backend::QueueStats;
    let backend = MemoryBackend::new();
    let key = IdempotencyKey::builder("other").fact("n", 1).build().unwrap();
    backend.enqueue(NewJob::new("other", key, json!({})).unwrap()).await.unwrap();
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        .build()
        .start();
    succeeded(&worker, 1, Duration::from_millis(2000)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = worker.shutdown().await;
    assert_eq!((stats.claimed, stats.succeeded, stats.dead_lettered), (1, 1, 0));
    let left = backend.counts().await.unwrap();
    assert_eq!((left.queued, left.running, left.scheduled), (1, 0, Some(0)), "left for a worker that has a handler");
    assert!(left.oldest_ready.is_some(), "and waiting since it was enqueued");
    assert_eq!(backend.count_open().await.unwrap(), 0);
}

#[tokio::test]
async fn a_panicking_handler_is_retried_to_the_cap() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    let runs = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&runs);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(move |_job: Ping, _ctx: JobContext| {
            *counter.lock().unwrap() += 1;
            async move {
                if true {
                    panic!("bug in the handler");
                }
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    worker.shutdown().await;
    assert_eq!((record.attempts, *runs.lock().unwrap()), (3, 3));
    assert!(record.last_error.contains("the handler panicked: bug in the handler"), "{}", record.last_error);
}

#[tokio::test]
async fn a_handler_panicking_before_its_future_is_a_failed_attempt_with_its_message() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    let runs = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&runs);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(move |job: Ping, _ctx: JobContext| {
            *counter.lock().unwrap() += 1;
            if job.n > 0 {
                // A `String` payload, as a formatted panic has.
                panic!("no limit configured for ping {}", job.n);
            }
            async move { Ok::<_, JobError>(()) }
        })
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    let stats = worker.shutdown().await;
    assert_eq!((record.attempts, *runs.lock().unwrap(), stats.retried), (3, 3, 2), "every attempt ran and failed");
    assert!(
        record.last_error.contains("the handler panicked: no limit configured for ping 1"),
        "{}",
        record.last_error
    );
    assert!(record.errors.iter().all(|e| e.error.contains("no limit configured")), "{:?}", record.errors);
}

#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    order: u32,
    card: Card,
}

#[derive(Debug, Serialize, Deserialize)]
struct Card {
    number: u64,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

/// Every alert's summary (the webhook's text), kept.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<String>>>);

impl AlertSink for Collect {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, crate::Result<()>> {
        self.0.lock().unwrap().push(alert.summary());
        Box::pin(async { Ok(()) })
    }
}

/// Tracing output, as a subscriber writing into a buffer gets it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_payload_that_does_not_decode_is_named_by_field_never_by_value() {
    const CANARY: &str = "4111111111111111";
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test's runtime is single-threaded: the worker's tasks log through this subscriber.
    let _logging = tracing::subscriber::set_default(subscriber);
    let backend = MemoryBackend::new();
    let key = IdempotencyKey::builder("charge").fact("order", 7).build().unwrap();
    let payload = json!({"order": 7, "card": {"number": CANARY}});
    backend.enqueue(NewJob::new("charge", key, payload.clone()).unwrap()).await.unwrap();
    let alerts = Collect::default();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Charge>(|_job: Charge, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        .alert(alerts.clone())
        .alert(TracingAlerts)
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    worker.shutdown().await;
    assert_eq!(record.payload, payload, "the record keeps the payload, for a replay");
    assert_eq!(record.attempts, 1);
    assert_eq!(record.last_error, "payload does not decode: field `card.number`: invalid type: string, expected u64");
    let alerts = alerts.0.lock().unwrap().join("\n");
    assert!(alerts.contains("field `card.number`"), "{alerts}");
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("failure record written"), "the subscriber saw the worker: {logs}");
    for (what, text) in [("last error", &record.last_error), ("alert", &alerts), ("logs", &logs)] {
        assert!(!text.contains(CANARY), "the {what} quotes the payload: {text}");
    }
}

#[test]
fn builder_setters_compose_in_any_order_and_with_a_base_config() {
    let backend = MemoryBackend::new();
    let base = WorkerConfig { concurrency: 16, batch: 64, poll: Duration::from_millis(5), ..WorkerConfig::default() };
    let built = |b: WorkerBuilder<MemoryBackend, MemoryBackend>| b.build().config().clone();
    let before = built(
        Worker::builder(backend.clone(), backend.clone())
            .concurrency(2)
            .heartbeat(Some(Duration::from_secs(1)))
            .claimers(1)
            .config(base.clone())
            .lease(Duration::from_secs(9))
            .batch(10)
            .poll(Duration::from_millis(250))
            .shutdown_grace(Duration::from_secs(3)),
    );
    let after = built(
        Worker::builder(backend.clone(), backend.clone())
            .config(base.clone())
            .shutdown_grace(Duration::from_secs(3))
            .poll(Duration::from_millis(250))
            .batch(10)
            .lease(Duration::from_secs(9))
            .claimers(1)
            .heartbeat(Some(Duration::from_secs(1)))
            .concurrency(2),
    );
    for config in [&before, &after] {
        assert_eq!((config.concurrency, config.batch, config.claimers), (2, 10, 1));
        assert_eq!((config.lease, config.heartbeat), (Duration::from_secs(9), Some(Duration::from_secs(1))));
        assert_eq!((config.poll, config.shutdown_grace), (Duration::from_millis(250), Duration::from_secs(3)));
    }
    // Without a heartbeat setter, the heartbeat follows the lease; off in the base stays off.
    let follows = built(Worker::builder(backend.clone(), backend.clone()).lease(Duration::from_secs(9)));
    assert_eq!(follows.heartbeat, Some(Duration::from_secs(3)));
    let off = WorkerConfig { heartbeat: None, ..base };
    let stays_off = built(Worker::builder(backend.clone(), backend.clone()).lease(Duration::from_secs(9)).config(off));
    assert_eq!((stays_off.heartbeat, stays_off.concurrency), (None, 16));
}

#[tokio::test]
async fn a_failing_alert_sink_keeps_the_record_and_permanent_errors_do_not_retry() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 2 }).await.unwrap();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("card declined")) })
        .alert(FailingSink)
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    let stats = worker.shutdown().await;
    assert_eq!((record.attempts, stats.retried, stats.dead_lettered), (1, 0, 1));
    assert_eq!(backend.count_open().await.unwrap(), 1, "the record outlives the failed alert");
}

#[tokio::test]
async fn a_closure_is_an_alert_sink() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 4 }).await.unwrap();
    let alerts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&alerts);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("card declined")) })
        .alert_fn(move |alert: Alert| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push((alert.record.id.clone(), alert.summary()));
                Ok(())
            }
        })
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    worker.shutdown().await;
    let alerts = alerts.lock().unwrap();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0].0, record.id);
    assert!(alerts[0].1.contains("card declined"), "{}", alerts[0].1);
}

fn queued_running(counts: crate::backend::Counts) -> (u64, u64) {
    (counts.queued, counts.running)
}

#[tokio::test]
async fn counts_show_queued_and_running_jobs_until_the_queue_drains() {
    use crate::backend::{QueueStats, QueueStatsExt};
    let backend = MemoryBackend::new();
    for n in 0..4 {
        backend.enqueue_job(&Ping { n }).await.unwrap();
    }
    assert_eq!(queued_running(backend.counts().await.unwrap()), (4, 0));
    let held =
        backend.claim(&crate::backend::Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap().remove(0);
    assert_eq!(queued_running(backend.counts().await.unwrap()), (3, 1));
    let left = backend.wait_until_drained(Duration::from_millis(100)).await.unwrap();
    assert_eq!(queued_running(left), (3, 1), "nothing works the queue yet");
    backend.release(&held.lease).await.unwrap();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .start();
    let drained = backend.wait_until_drained(Duration::from_secs(10)).await.unwrap();
    let stats = worker.shutdown().await;
    assert!(drained.is_drained(), "{drained:?}");
    assert_eq!(stats.succeeded, 4, "drained means every job finished");
}

#[tokio::test]
async fn a_requested_retry_delay_is_honoured() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 3 }).await.unwrap();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&starts);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(move |_job: Ping, ctx: JobContext| {
            seen.lock().unwrap().push(Instant::now());
            async move {
                if ctx.attempt == 1 {
                    return Err(JobError::retry_after(Duration::from_millis(300), "429 Too Many Requests"));
                }
                Ok(())
            }
        })
        .build()
        .start();
    for _ in 0..200 {
        if starts.lock().unwrap().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown().await;
    let starts = starts.lock().unwrap();
    assert_eq!(starts.len(), 2);
    assert!(starts[1] - starts[0] >= Duration::from_millis(300));
}

/// The memory backend as a ledger whose hold extensions never return: a stalled connection.
#[derive(Clone)]
struct StalledHolds(MemoryBackend);

impl Ledger for StalledHolds {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: crate::key::ProviderKey,
        hold: Duration,
    ) -> crate::Result<crate::backend::Begin> {
        self.0.begin(key, payload, provider_key, hold).await
    }
    async fn extend_hold(&self, _hold: &crate::backend::Hold, _by: Duration) -> crate::Result<()> {
        std::future::pending().await
    }
    async fn release_hold(&self, hold: &crate::backend::Hold) -> crate::Result<()> {
        self.0.release_hold(hold).await
    }
    async fn finish(&self, hold: &crate::backend::Hold, result: &Value) -> crate::Result<()> {
        self.0.finish(hold, result).await
    }
}

/// Sets the time it was dropped: when the worker cancelled the handler holding it.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

#[tokio::test]
async fn a_handler_whose_hold_cannot_be_renewed_is_cancelled_before_the_hold_lapses() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 9 }).await.unwrap();
    let lease = Duration::from_millis(600);
    let dropped = Arc::new(Mutex::new(None));
    let (clock, effects) = (Arc::clone(&dropped), Arc::new(Mutex::new(0)));
    let done = Arc::clone(&effects);
    let started = Instant::now();
    let worker = Worker::builder(backend.clone(), StalledHolds(backend.clone()))
        .config(WorkerConfig { lease, claim_lease: lease, ..fast() })
        .handle::<Ping>(move |_job: Ping, _ctx: JobContext| {
            let guard = DropClock(Arc::clone(&clock));
            let done = Arc::clone(&done);
            async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                *done.lock().unwrap() += 1; // the effect, had it not been cancelled
                drop(guard);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    for _ in 0..200 {
        if worker.stats().cancelled >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = worker.shutdown_within(Duration::ZERO).await;
    let cancelled_at = dropped.lock().unwrap().expect("the handler was cancelled") - started;
    assert!(stats.cancelled >= 1, "{stats:?}");
    assert!(cancelled_at < lease, "cancelled {cancelled_at:?} after the start; the hold lapses after {lease:?}");
    assert_eq!(*effects.lock().unwrap(), 0, "no effect from a handler that lost its hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_never_wait_for_more_room_than_there_is() {
    // Three handlers and one claimer: a claim rounded up to four would wait for ever. Then the
    // jobs turn slow after the pace has learned they are quick: claims sized for quick jobs must
    // shrink to what fits, or the worker stops claiming.
    let backend = MemoryBackend::new();
    for n in 0..60 {
        backend.enqueue_job(&Ping { n }).await.unwrap();
    }
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(WorkerConfig { concurrency: 3, claimers: 1, ..fast() })
        .handle::<Ping>(|job: Ping, _ctx: JobContext| async move {
            if job.n >= 50 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, JobError>(())
        })
        .build()
        .start();
    succeeded(&worker, 60, Duration::from_millis(3000)).await;
    let stats = worker.shutdown().await;
    assert_eq!(stats.succeeded, 60, "{stats:?}");
}

#[tokio::test]
async fn a_sink_for_critical_records_hears_only_of_those_and_another_hears_of_all() {
    use crate::alert::AlertSinkExt;
    use crate::job::Severity;

    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 5 }).await.unwrap();
    let mut critical = NewJob::from_job(&Ping { n: 6 }).unwrap();
    critical.severity = Severity::Critical;
    backend.enqueue(critical).await.unwrap();
    let (paged, chat) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let sink = |seen: &Arc<Mutex<Vec<Severity>>>| {
        let seen = Arc::clone(seen);
        crate::alert::from_fn(move |alert: Alert| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(alert.record.severity);
                Ok(())
            }
        })
    };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("declined")) })
        .alert(sink(&paged).at_least(Severity::Critical))
        .alert(sink(&chat))
        .build()
        .start();
    records(&backend, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.shutdown().await;
    assert_eq!(*paged.lock().unwrap(), [Severity::Critical]);
    let mut all = chat.lock().unwrap().clone();
    all.sort();
    assert_eq!(all, [Severity::Error, Severity::Critical]);
    assert!(Severity::Warning < Severity::Error && Severity::Error < Severity::Critical);
}

#[tokio::test]
async fn a_record_left_open_is_reminded_once_per_period_until_it_is_closed() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 7 }).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let config = WorkerConfig {
        alert_sweep: Duration::from_millis(50),
        remind_after: Some(Duration::from_millis(300)),
        ..fast()
    };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("declined")) })
        .alert_fn(move |alert: Alert| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().push((alert.reminder, alert.summary()));
                Ok(())
            }
        })
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    backend.discard(&record.id, "handled", "ada").await.unwrap();
    let at_discard = seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.shutdown().await;
    let seen = seen.lock().unwrap();
    let reminders: Vec<u32> = seen.iter().map(|(n, _)| *n).collect();
    assert_eq!(reminders.first(), Some(&0), "the alert first: {reminders:?}");
    assert!(reminders.len() >= 3, "reminders while open: {reminders:?}");
    assert!(reminders.windows(2).all(|w| w[1] == w[0] + 1), "each once, in order: {reminders:?}");
    assert!(seen[1].1.contains("reminder 1, still open after"), "{}", seen[1].1);
    assert_eq!(seen.len(), at_discard, "none after the record is closed");
}

/// A job whose payload's decoder panics: a custom `Deserialize` with a bug.
#[derive(Serialize)]
struct Brittle {
    n: u32,
}

impl<'de> Deserialize<'de> for Brittle {
    fn deserialize<D: serde::Deserializer<'de>>(_deserializer: D) -> Result<Self, D::Error> {
        panic!("the decoder has a bug");
    }
}

impl Job for Brittle {
    const KIND: &'static str = "brittle";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_that_panics_is_an_undecodable_payload_recorded_at_once() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Brittle { n: 1 }).await.unwrap();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(WorkerConfig { lease: Duration::from_secs(30), ..fast() })
        .handle::<Brittle>(|_job: Brittle, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        .build()
        .start();
    // Within a fraction of the lease: a panic that escaped would leave the job to wait it out.
    let record = records(&backend, 1).await.remove(0);
    let stats = worker.shutdown().await;
    assert_eq!(record.attempts, 1, "decoding again cannot succeed: no retries");
    assert_eq!(record.last_error, "payload does not decode: the decoder panicked: the decoder has a bug");
    assert_eq!((stats.claimed, stats.dead_lettered), (1, 1));
}

/// A handler for `Ping` that never ends; every start's (attempt, whether an earlier attempt was
/// left pending) kept.
fn hanging(starts: &Arc<Mutex<Vec<(u32, bool)>>>) -> impl Handler<Ping> + use<> {
    let starts = Arc::clone(starts);
    move |_job: Ping, ctx: JobContext| {
        starts.lock().unwrap().push((ctx.attempt, ctx.earlier_attempt_pending));
        std::future::pending::<Result<(), JobError>>()
    }
}

async fn started(starts: &Arc<Mutex<Vec<(u32, bool)>>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while starts.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "{n} handler starts expected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_still_running_when_the_grace_ends_is_released_at_no_attempts_cost() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let config = WorkerConfig { lease: Duration::from_secs(30), shutdown_grace: Duration::from_millis(100), ..fast() };
    let start = || {
        Worker::builder(backend.clone(), backend.clone())
            .config(config.clone())
            .handle::<Ping>(hanging(&starts))
            .build()
            .start()
    };
    // A job longer than the grace meets four deploys, one more than its cap of 3: it must not
    // end as a record.
    for deploy in 1..=4 {
        let worker = start();
        started(&starts, deploy).await;
        let stats = worker.shutdown().await;
        assert_eq!(stats.released, 1, "deploy {deploy}: {stats:?}");
    }
    assert_eq!(backend.count_open().await.unwrap(), 0, "released jobs are not failures");
    let starts = starts.lock().unwrap().clone();
    assert_eq!(
        starts,
        [(1, false), (1, true), (1, true), (1, true)],
        "each the first attempt, resumed after the first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_dropped_without_a_shutdown_shuts_down() {
    use crate::backend::QueueStats;
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let config = WorkerConfig { lease: Duration::from_secs(30), shutdown_grace: Duration::from_millis(100), ..fast() };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ping>(hanging(&starts))
        .build()
        .start();
    started(&starts, 1).await;
    drop(worker);
    // Its running job is released after the grace, long before its 30 s lease, and nothing
    // claims it again: the worker stopped.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let counts = backend.counts().await.unwrap();
        if (counts.queued, counts.running) == (1, 0) {
            break;
        }
        assert!(Instant::now() < deadline, "the dropped worker still holds its job: {counts:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(starts.lock().unwrap().len(), 1, "a dropped worker claims nothing more");
    assert_eq!(backend.counts().await.unwrap().queued, 1);
}

/// Every start of a job's handler: (its `n`, the attempt, when).
type Starts = Arc<Mutex<Vec<(u32, u32, Instant)>>>;

/// A `Ping` handler that says "not now" (for `delay`) at its first `times` starts of each job,
/// then succeeds for even `n` and fails permanently for odd.
fn not_now_then(starts: &Starts, times: usize, delay: Duration) -> impl Handler<Ping> + use<> {
    let starts = Arc::clone(starts);
    move |job: Ping, ctx: JobContext| {
        let mut seen = starts.lock().unwrap();
        seen.push((job.n, ctx.attempt, Instant::now()));
        let earlier = seen.iter().filter(|(n, ..)| *n == job.n).count();
        async move {
            if earlier <= times {
                return Err(JobError::not_now(delay, "429 Too Many Requests"));
            }
            if job.n % 2 == 1 {
                return Err(JobError::permanent("card declined"));
            }
            Ok(())
        }
    }
}

fn starts_of(starts: &Starts, n: u32) -> Vec<(u32, Instant)> {
    starts.lock().unwrap().iter().filter(|(m, ..)| *m == n).map(|(_, a, at)| (*a, *at)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_now_puts_a_job_back_at_no_attempts_cost_past_the_cap_count() {
    let backend = MemoryBackend::new();
    // Cap 3; each says "not now" four times, one more than its cap.
    backend.enqueue_job(&Ping { n: 10 }).await.unwrap();
    backend.enqueue_job(&Ping { n: 11 }).await.unwrap();
    let starts = Starts::default();
    let delay = Duration::from_millis(150);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(fast())
        .handle::<Ping>(not_now_then(&starts, 4, delay))
        .build()
        .start();
    succeeded(&worker, 1, Duration::from_secs(5)).await;
    let record = records(&backend, 1).await.remove(0);
    let stats = worker.shutdown().await;
    for n in [10, 11] {
        let runs = starts_of(&starts, n);
        assert_eq!(runs.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [1; 5], "job {n}: every run on attempt 1");
        assert!(runs.windows(2).all(|w| w[1].1 - w[0].1 >= delay), "job {n} ran again before its delay");
    }
    assert_eq!((stats.succeeded, stats.deferred, stats.retried, stats.dead_lettered), (1, 8, 0, 1), "{stats:?}");
    // The job that failed in the end: its record holds the one attempt, with the one error.
    assert_eq!((record.key.as_str(), record.attempts), ("ping:n=11", 1));
    let history: Vec<_> = record.errors.iter().map(|e| (e.attempt, e.error.as_str())).collect();
    assert_eq!(history, [(1, "card declined")], "no error written for a \"not now\"");
    assert_eq!(backend.count_open().await.unwrap(), 1, "no record for the job that succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_older_than_max_not_now_spends_attempts_and_ends_as_a_record() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Ping { n: 12 }).await.unwrap();
    let starts = Starts::default();
    let config = WorkerConfig { max_not_now: Duration::from_millis(300), ..fast() };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ping>(not_now_then(&starts, usize::MAX, Duration::from_millis(100)))
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    let stats = worker.shutdown().await;
    let attempts: Vec<u32> = starts_of(&starts, 12).iter().map(|(a, _)| *a).collect();
    // Young: put back on attempt 1, unspent; then each "not now" a retry, to the cap.
    assert!(attempts.len() >= 4 && attempts.ends_with(&[1, 2, 3]), "{attempts:?}");
    assert!(attempts[..attempts.len() - 2].iter().all(|a| *a == 1), "{attempts:?}");
    assert_eq!((record.attempts, record.last_error.as_str()), (3, "429 Too Many Requests"));
    assert_eq!(record.errors.iter().map(|e| e.attempt).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1), "{stats:?}");
    assert!(stats.deferred >= 1, "{stats:?}");
}

/// A `Ping` with a limit on each attempt.
#[derive(Serialize, Deserialize)]
struct Timed {
    n: u32,
    /// How long its handler takes.
    takes_ms: u64,
}

impl Job for Timed {
    const KIND: &'static str = "timed";
    const CAP: Option<u32> = Some(3);
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(200));
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

/// Counts the handlers dropped before they finished.
struct DropCount(Arc<Mutex<u32>>);

impl Drop for DropCount {
    fn drop(&mut self) {
        *self.0.lock().unwrap() += 1;
    }
}

/// A `Timed` handler taking its job's time; counts its effects and the handlers dropped early.
fn takes_its_time(effects: &Arc<Mutex<Vec<u32>>>, dropped: &Arc<Mutex<u32>>) -> impl Handler<Timed> + use<> {
    let (effects, dropped) = (Arc::clone(effects), Arc::clone(dropped));
    move |job: Timed, _ctx: JobContext| {
        let (effects, guard) = (Arc::clone(&effects), DropCount(Arc::clone(&dropped)));
        async move {
            tokio::time::sleep(Duration::from_millis(job.takes_ms)).await;
            effects.lock().unwrap().push(job.n);
            std::mem::forget(guard); // finished: not dropped early
            Ok::<_, JobError>(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_is_cancelled_and_retried_to_a_record_and_a_quick_one_succeeds() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Timed { n: 1, takes_ms: 10_000 }).await.unwrap();
    backend.enqueue_job(&Timed { n: 2, takes_ms: 20 }).await.unwrap();
    let (effects, dropped) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)));
    let started = Instant::now();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(WorkerConfig { lease: Duration::from_secs(30), ..fast() })
        .handle::<Timed>(takes_its_time(&effects, &dropped))
        .build()
        .start();
    let record = records(&backend, 1).await.remove(0);
    let took = started.elapsed();
    let stats = worker.shutdown().await;
    assert_eq!(*effects.lock().unwrap(), [2], "the quick job's effect, and none of the slow one's");
    assert_eq!(*dropped.lock().unwrap(), 3, "each attempt's handler dropped at the limit");
    assert_eq!((record.key.as_str(), record.attempts), ("timed:n=1", 3));
    assert_eq!(record.last_error, "timed out after 200ms");
    assert!(record.errors.iter().all(|e| e.error.starts_with("timed out after")), "{:?}", record.errors);
    // Three limits, not a lease: the key's hold was released for each retry.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!((stats.timed_out, stats.retried, stats.succeeded, stats.dead_lettered), (3, 2, 1, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_own_timeout_overrides_the_job_types() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Timed { n: 3, takes_ms: 400 }).await.unwrap();
    let (effects, dropped) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)));
    let worker = Worker::builder(backend.clone(), backend.clone())
        .timeout::<Timed>(Duration::from_secs(5))
        .config(fast())
        .handle::<Timed>(takes_its_time(&effects, &dropped))
        .build()
        .start();
    succeeded(&worker, 1, Duration::from_secs(5)).await;
    let stats = worker.shutdown().await;
    assert_eq!((effects.lock().unwrap().clone(), *dropped.lock().unwrap()), (vec![3], 0));
    assert_eq!((stats.succeeded, stats.timed_out), (1, 0), "{stats:?}");
}

/// Completion wins over a cancel asked of a running job: a handler that finishes before its
/// worker's next renewal has done its effect, which is never undone, and the job reads done. The
/// same cancel asked of a job that runs on is stopped at the renewal, counted `stopped`, and the
/// job ends cancelled with the audit, its handler dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_running_job_stops_it_unless_it_completes_first() {
    use crate::backend::{CancelOutcome, JobQuery, JobState, Jobs};
    use std::sync::atomic::{AtomicU32, Ordering};

    let backend = MemoryBackend::new();
    let finish = Arc::new(tokio::sync::Notify::new());
    let (started, effects) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let handler = {
        let (finish, started, effects) = (Arc::clone(&finish), Arc::clone(&started), Arc::clone(&effects));
        move |job: Ping, _ctx: JobContext| {
            let (finish, started, effects) = (Arc::clone(&finish), Arc::clone(&started), Arc::clone(&effects));
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                if job.n == 1 {
                    finish.notified().await;
                } else {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(())
            }
        }
    };
    // Renewals every 100 ms: the second job's cancel is seen within one.
    let config =
        WorkerConfig { lease: Duration::from_millis(300), heartbeat: Some(Duration::from_millis(100)), ..fast() };
    let worker =
        Worker::builder(backend.clone(), backend.clone()).config(config).handle::<Ping>(handler).build().start();
    let job_of = |n: u32| {
        let backend = backend.clone();
        async move {
            let key = IdempotencyKey::builder("ping").fact("n", n).build().unwrap();
            backend.list_jobs(&JobQuery { key: Some(key), ..JobQuery::default() }).await.unwrap().remove(0)
        }
    };
    let wait_started = |n: u32| {
        let started = Arc::clone(&started);
        async move {
            for _ in 0..500 {
                if started.load(Ordering::SeqCst) >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("{n} handlers should have started");
        }
    };

    // Completes right after the cancel, before a renewal: done, its effect kept.
    backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
    wait_started(1).await;
    let first = job_of(1).await;
    assert_eq!(backend.cancel_job(&first.id, "late", "ana").await.unwrap(), CancelOutcome::Requested);
    finish.notify_one();
    succeeded(&worker, 1, Duration::from_secs(5)).await;
    assert_eq!(job_of(1).await.state, JobState::Done, "completion wins over the cancel asked");
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    // Runs on: stopped at the next renewal, the job cancelled with its audit.
    backend.enqueue_job(&Ping { n: 2 }).await.unwrap();
    wait_started(2).await;
    let second = job_of(2).await;
    assert_eq!(backend.cancel_job(&second.id, "withdrawn", "ben").await.unwrap(), CancelOutcome::Requested);
    for _ in 0..200 {
        if job_of(2).await.state == JobState::Cancelled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = job_of(2).await;
    assert_eq!(stopped.state, JobState::Cancelled, "{stopped:?}");
    assert_eq!(stopped.cancelled.map(|c| (c.reason, c.actor)), Some(("withdrawn".into(), "ben".into())));
    assert_eq!(worker.stats().stopped, 1);
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the stopped handler did no effect");
    tokio::time::timeout(Duration::from_secs(5), worker.shutdown()).await.expect("no handler left to wait for");
}
