//! The four checks of reliable jobs, on the embedded in-memory backend:
//!
//! 1. replay:  the same job enqueued twice has one key and causes one effect;
//! 2. race:    two workers handed the same job at once: one effect, one recorded skip;
//! 3. exhaust: a job that keeps failing uses every attempt, leaves a full failure record and
//!    raises one alert;
//! 4. recover: a replay from that record causes the effect once and closes the record.
//!
//! Run: `cargo run --example quickstart` (add `RUST_LOG=redrive_core=info` to see the worker's
//! log lines: the skip, the retries, the failure record).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive::alert::BoxFuture;
use redrive::{
    Alert, AlertSink, Backoff, DeadLetter, Enqueue, EnqueueExt, FailureQuery, Job, JobContext, JobError, KeyBuilder,
    MemoryBackend, NewJob, Replay, Worker,
};
use serde::{Deserialize, Serialize};

/// Email an order's receipt: one receipt per order, whatever the queue delivers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SendReceipt {
    order_id: u64,
    email: String,
}

impl Job for SendReceipt {
    const KIND: &'static str = "send_receipt";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order_id)
    }
}

/// The outside world: receipts "sent", and a switch that makes the mail provider fail.
#[derive(Default)]
struct Mailer {
    sent: Mutex<Vec<String>>,
    down: AtomicBool,
}

impl Mailer {
    fn sent_for(&self, order_id: u64) -> usize {
        self.sent.lock().unwrap().iter().filter(|line| line.contains(&format!("order {order_id} "))).count()
    }
}

async fn send_receipt(mailer: Arc<Mailer>, job: SendReceipt, ctx: JobContext) -> Result<String, JobError> {
    if mailer.down.load(Ordering::SeqCst) {
        return Err(JobError::retry("mail provider answered 503 Service Unavailable"));
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // the provider call
    let line = format!("receipt for order {} (provider key {})", job.order_id, ctx.provider_key);
    mailer.sent.lock().unwrap().push(line.clone());
    Ok(line)
}

/// Prints alerts as they arrive, with their time.
struct PrintAlerts(Arc<Mutex<Vec<Alert>>>);

impl AlertSink for PrintAlerts {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive::Result<()>> {
        self.0.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

fn worker_on<Q, L>(queue: Q, ledger: L, mailer: &Arc<Mailer>, alerts: &Arc<Mutex<Vec<Alert>>>) -> redrive::RunningWorker
where
    Q: redrive::kit::Claim + redrive::DeadLetter + 'static,
    L: redrive::kit::Ledger + 'static,
{
    let mailer = Arc::clone(mailer);
    Worker::builder(queue, ledger)
        .handle::<SendReceipt>(move |job, ctx| send_receipt(Arc::clone(&mailer), job, ctx))
        // Short delays so the demo takes seconds; the defaults are a 30 s lease and backoff from
        // 1 s doubling to 5 minutes.
        .lease(Duration::from_secs(3))
        .backoff(Backoff { base: Duration::from_millis(20), max: Duration::from_millis(200), ..Backoff::default() })
        .alert(PrintAlerts(Arc::clone(alerts)))
        .build()
        .start()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()))
        .init();
    let backend = MemoryBackend::new();
    let mailer = Arc::new(Mailer::default());
    let alerts = Arc::new(Mutex::new(Vec::new()));

    println!("== 1. replay: the same job enqueued twice");
    let receipt = SendReceipt { order_id: 42, email: "ada@example.com".into() };
    let first = backend.enqueue_job(&receipt).await?;
    let second = backend.enqueue_job(&receipt).await?;
    let key = NewJob::from_job(&receipt)?.key;
    println!("   enqueue #1 -> {first:?}   key {key}");
    println!("   enqueue #2 -> {second:?} key {key}");
    let worker = worker_on(backend.clone(), backend.clone(), &mailer, &alerts);
    wait_until("the receipt", || mailer.sent_for(42) == 1).await;
    let stats = worker.shutdown().await;
    println!("   receipts sent for order 42: {}   (worker: {} succeeded)", mailer.sent_for(42), stats.succeeded);

    println!("\n== 2. race: two workers handed the same job at once");
    println!("   (two deliveries of one message, as an SQS standard queue may make; one ledger)");
    let (inbox_a, inbox_b) = (MemoryBackend::new(), MemoryBackend::new());
    let race = SendReceipt { order_id: 43, email: "bob@example.com".into() };
    let job = NewJob::from_job(&race)?;
    inbox_a.enqueue(job.clone()).await?;
    inbox_b.enqueue(job.clone()).await?;
    let worker_a = worker_on(inbox_a, backend.clone(), &mailer, &alerts);
    let worker_b = worker_on(inbox_b, backend.clone(), &mailer, &alerts);
    wait_until("one worker to skip", || worker_a.stats().skipped + worker_b.stats().skipped == 1).await;
    let (a, b) = (worker_a.shutdown().await, worker_b.shutdown().await);
    println!("   worker A: {} succeeded, {} deferred, {} skipped", a.succeeded, a.deferred, a.skipped);
    println!("   worker B: {} succeeded, {} deferred, {} skipped", b.succeeded, b.deferred, b.skipped);
    println!("   receipts sent for order 43: {}   (key {})", mailer.sent_for(43), job.key);

    println!("\n== 3. exhaust: the mail provider is down");
    mailer.down.store(true, Ordering::SeqCst);
    let failing = SendReceipt { order_id: 44, email: "cy@example.com".into() };
    backend.enqueue_job(&failing).await?;
    let worker = worker_on(backend.clone(), backend.clone(), &mailer, &alerts);
    wait_until("the alert", || !alerts.lock().unwrap().is_empty()).await;
    let stats = worker.shutdown().await;
    let record = backend.list(&FailureQuery::open()).await?.remove(0);
    println!("   attempts: {} retried, then {} failure record", stats.retried, stats.dead_lettered);
    println!("   failure record {}:", record.id);
    println!("     kind      {}", record.kind);
    println!("     key       {}", record.key);
    println!("     payload   {}", record.payload);
    println!("     attempts  {} of {}", record.attempts, record.cap);
    println!("     error     {}", record.last_error);
    for e in &record.errors {
        println!("       attempt {} at {}: {}", e.attempt, e.at.format("%H:%M:%S%.3f"), e.error);
    }
    println!("   open failure records: {}", backend.count_open().await?);
    for alert in alerts.lock().unwrap().iter() {
        println!("   ALERT at {}: {}", alert.raised_at.format("%Y-%m-%d %H:%M:%S%.3f UTC"), alert.summary());
    }

    println!("\n== 4. recover: the provider is back; replay the record");
    mailer.down.store(false, Ordering::SeqCst);
    let outcome = backend.replay(&record.id, "the API is back", "example").await?;
    println!(
        "   replay {} -> {outcome:?} (same key {}, same provider key {})",
        record.id, record.key, record.provider_key
    );
    let worker = worker_on(backend.clone(), backend.clone(), &mailer, &alerts);
    wait_until("the replayed receipt", || mailer.sent_for(44) == 1).await;
    let again = backend.replay(&record.id, "the API is back", "example").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let closed = backend.get(&record.id).await?;
    println!("   receipts sent for order 44: {}", mailer.sent_for(44));
    println!("   record {} is now {:?}", closed.id, closed.state);
    println!("   replaying it again -> {again:?}; receipts for order 44 still {}", mailer.sent_for(44));
    println!(
        "   open failure records: {}; alerts raised in all: {}",
        backend.count_open().await?,
        alerts.lock().unwrap().len()
    );
    Ok(())
}
