//! The four checks of reliable jobs, the same on every broker backend (SQS, Azure, QStash,
//! Inngest, pgmq): shared by their examples.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive::alert::BoxFuture;
use redrive::kit::{Claim, Dedupe};
use redrive::postgres::PgBackend;
use redrive::{
    Alert, AlertSink, Backoff, DeadLetter, Enqueue, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob,
    Replay, RunningWorker, Worker,
};
use serde::{Deserialize, Serialize};

/// Charge an order: once per order, with the provider key sent to the payment provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChargeOrder {
    order: u64,
    cents: u64,
}

impl Job for ChargeOrder {
    const KIND: &'static str = "charge_order";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

#[derive(Default)]
struct Payments {
    charges: Mutex<Vec<u64>>,
    down: AtomicBool,
}

impl Payments {
    fn for_order(&self, order: u64) -> usize {
        self.charges.lock().unwrap().iter().filter(|o| **o == order).count()
    }
}

struct Alerts(Arc<Mutex<Vec<Alert>>>);

impl AlertSink for Alerts {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive::Result<()>> {
        self.0.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

fn worker<Q: Claim + DeadLetter + Clone + 'static>(
    queue: &Q,
    ledger: &PgBackend,
    payments: &Arc<Payments>,
    alerts: &Arc<Mutex<Vec<Alert>>>,
) -> RunningWorker {
    let payments = Arc::clone(payments);
    Worker::builder(queue.clone(), ledger.clone())
        .handle::<ChargeOrder>(move |job: ChargeOrder, _ctx: JobContext| {
            let payments = Arc::clone(&payments);
            async move {
                if payments.down.load(Ordering::SeqCst) {
                    return Err(JobError::retry("payment provider answered 502 Bad Gateway"));
                }
                payments.charges.lock().unwrap().push(job.order);
                Ok(job.cents)
            }
        })
        .backoff(Backoff { base: Duration::from_millis(20), max: Duration::from_millis(200), ..Backoff::default() })
        .alert(Alerts(Arc::clone(alerts)))
        .build()
        .start()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Replay, race, exhaust and recover on `queue`, with the effect ledger and the failure records
/// in `ledger`.
pub(crate) async fn four_checks<Q>(queue: &Q, ledger: &PgBackend) -> Result<(), Box<dyn std::error::Error>>
where
    Q: Claim + DeadLetter + Replay + Enqueue + Clone + 'static,
{
    let (payments, alerts) = (Arc::new(Payments::default()), Arc::new(Mutex::new(Vec::new())));
    println!("\n== 1. replay: the same job sent twice");
    let charge = ChargeOrder { order: 1001, cents: 4_200 };
    let job = NewJob::from_job(&charge)?;
    let (first, second) = (queue.enqueue(job.clone()).await?, queue.enqueue(job.clone()).await?);
    println!("   send #1 -> {first:?}");
    // A broker without dedupe (SQS standard, Azure) delivers both; QStash and pgmq drop the second.
    println!("   send #2 -> {second:?}   both carry key {}", job.key);
    // Inngest drops the second too, but its event API cannot say so: both answer Created.
    let unreported = matches!(queue.capabilities().dedupe, Dedupe::Unreported(_));
    let delivered = |sent: u64| if unreported { sent.min(1) } else { sent };
    let sent = delivered([&first, &second].iter().filter(|e| e.is_created()).count() as u64);
    let w = worker(queue, ledger, &payments, &alerts);
    wait_until("the messages sent to be handled", || w.stats().succeeded + w.stats().skipped == sent).await;
    let stats = w.shutdown().await;
    println!("   worker: {} charged, {} skipped by the ledger", stats.succeeded, stats.skipped);
    println!("   charges for order 1001: {}", payments.for_order(1001));

    println!("\n== 2. race: two workers, the same message twice");
    let race = NewJob::from_job(&ChargeOrder { order: 1002, cents: 990 })?;
    let sent = delivered(
        queue.enqueue_batch(vec![race.clone(), race.clone()]).await?.iter().filter(|e| e.is_created()).count() as u64,
    );
    let (a, b) = (worker(queue, ledger, &payments, &alerts), worker(queue, ledger, &payments, &alerts));
    wait_until("one charge, and a skip for a second message", || {
        let (x, y) = (a.stats(), b.stats());
        x.succeeded + y.succeeded == 1 && x.skipped + y.skipped == sent - 1
    })
    .await;
    let (x, y) = (a.shutdown().await, b.shutdown().await);
    println!("   worker A: {} charged, {} deferred, {} skipped", x.succeeded, x.deferred, x.skipped);
    println!("   worker B: {} charged, {} deferred, {} skipped", y.succeeded, y.deferred, y.skipped);
    println!("   charges for order 1002: {}", payments.for_order(1002));

    println!("\n== 3. exhaust: the payment provider is down");
    payments.down.store(true, Ordering::SeqCst);
    queue.enqueue(NewJob::from_job(&ChargeOrder { order: 1003, cents: 12_500 })?).await?;
    let w = worker(queue, ledger, &payments, &alerts);
    wait_until("the alert", || !alerts.lock().unwrap().is_empty()).await;
    w.shutdown().await;
    let record = queue.list(&FailureQuery::open()).await?.remove(0);
    println!("   read back from the record store: record {}", record.id);
    println!("     kind {}  key {}", record.kind, record.key);
    println!("     payload  {}", record.payload);
    println!("     error    {}", record.last_error);
    println!("     attempts {} of {} at {}", record.attempts, record.cap, record.last_failed_at.format("%H:%M:%S%.3f"));
    println!("   open records: {}", queue.count_open().await?);
    for alert in alerts.lock().unwrap().iter() {
        println!("   ALERT at {}: {}", alert.raised_at.format("%Y-%m-%d %H:%M:%S%.3f UTC"), alert.summary());
    }

    println!("\n== 4. recover: the provider is back; replay the record to the source queue");
    payments.down.store(false, Ordering::SeqCst);
    println!(
        "   replay -> {:?} (a new message, the original keys)",
        queue.replay(&record.id, "the API is back", "example").await?
    );
    let w = worker(queue, ledger, &payments, &alerts);
    wait_until("the replayed charge", || payments.for_order(1003) == 1).await;
    println!("   replay again -> {:?}", queue.replay(&record.id, "the API is back", "example").await?);
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.shutdown().await;
    println!("   charges for order 1003: {}", payments.for_order(1003));
    println!("   record state: {:?}; open records: {}", queue.get(&record.id).await?.state, queue.count_open().await?);
    Ok(())
}
