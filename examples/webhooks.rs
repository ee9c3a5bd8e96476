//! A webhook inbox for Stripe-style events on the embedded in-memory backend: each verified event
//! becomes one job, keyed by its event id, and a worker fulfils the order once, however Stripe
//! delivers it.
//!
//! 1. an event delivered twice at the same instant: both answered 200, one job, one effect;
//! 2. a delivery with a forged signature, and one captured and sent again ten minutes later:
//!    refused (401), nothing stored;
//! 3. the same event id with another body: refused (409), the first body kept;
//! 4. a handler that fails: the event's job is retried, then kept as a failure record whose
//!    replay fulfils the order once.
//!
//! Run: `cargo run -p redrive-examples --example webhooks --features webhooks`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use redrive::{
    Backoff, DeadLetter, FailureQuery, JobContext, JobError, MemoryBackend, QueueStats, Replay, RunningWorker, Worker,
};
use redrive_http::webhook::{Event, Inbox, Stripe, WebhookEvent};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The part of Stripe's `checkout.session.completed` event the shop reads.
#[derive(Debug, Serialize, Deserialize)]
struct CheckoutCompleted {
    #[serde(rename = "type")]
    kind: String,
    data: Checkout,
}

#[derive(Debug, Serialize, Deserialize)]
struct Checkout {
    order: u64,
    amount: u64,
}

impl Event for CheckoutCompleted {
    const KIND: &'static str = "checkout_completed";
    const CAP: Option<u32> = Some(3);
}

/// The warehouse: orders fulfilled, and a switch that makes it fail.
#[derive(Default)]
struct Warehouse {
    shipped: Mutex<Vec<u64>>,
    down: AtomicBool,
}

fn start_worker(queue: &MemoryBackend, warehouse: &Arc<Warehouse>) -> RunningWorker {
    let warehouse = Arc::clone(warehouse);
    Worker::builder(queue.clone(), queue.clone())
        .handle::<WebhookEvent<CheckoutCompleted>>(move |event: WebhookEvent<CheckoutCompleted>, ctx: JobContext| {
            let warehouse = Arc::clone(&warehouse);
            async move {
                if warehouse.down.load(Ordering::SeqCst) {
                    return Err(JobError::retry("the warehouse API answered 503"));
                }
                let order = event.event.data.order;
                warehouse.shipped.lock().unwrap().push(order);
                Ok(format!("order {order} shipped for event {} (attempt {})", event.id, ctx.attempt))
            }
        })
        .backoff(Backoff { base: Duration::from_millis(20), max: Duration::from_millis(100), ..Backoff::default() })
        .build()
        .start()
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
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
    let queue = MemoryBackend::new();
    let stripe = Stripe::new("whsec_example_endpoint_secret")?;
    let inbox = Inbox::new(queue.clone());
    let app = Router::new().route("/webhooks/stripe", inbox.endpoint::<CheckoutCompleted>("shop", stripe.clone())?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks/stripe", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    // What Stripe sends: the event, signed with the endpoint's secret at a time.
    let deliver = |body: String, signed_at: i64, signer: Stripe| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let signature = signer.signature_header(signed_at, body.as_bytes());
            client.post(&url).header("stripe-signature", signature).body(body).send().await.map(|r| r.status())
        }
    };
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let event = |id: &str, order: u64, amount: u64| {
        json!({"id": id, "object": "event", "type": "checkout.session.completed", "data": {"order": order, "amount": amount}})
            .to_string()
    };
    let warehouse = Arc::new(Warehouse::default());

    println!("== 1. one event delivered twice at the same instant");
    let body = event("evt_1001", 1001, 4200);
    let (a, b) =
        tokio::join!(deliver(body.clone(), now(), stripe.clone()), deliver(body.clone(), now(), stripe.clone()));
    println!("   answers: {} and {}", a?, b?);
    println!("   jobs queued: {}", queue.counts().await?.queued);
    let worker = start_worker(&queue, &warehouse);
    wait_until("the order shipped", || warehouse.shipped.lock().unwrap().contains(&1001)).await;
    let stats = worker.shutdown().await;
    println!("   orders shipped: {:?}   (worker: {} succeeded)", warehouse.shipped.lock().unwrap(), stats.succeeded);

    println!("\n== 2. a forged signature, and a delivery replayed ten minutes later");
    let forged = deliver(event("evt_1002", 1002, 1), now(), Stripe::new("whsec_guessed")?).await?;
    let late = deliver(event("evt_1003", 1003, 1), now() - 600, stripe.clone()).await?;
    println!("   forged: {forged}   ten minutes old: {late}   jobs queued: {}", queue.counts().await?.queued);

    println!("\n== 3. the same event id with another body");
    let other = deliver(event("evt_1001", 1001, 1), now(), stripe.clone()).await?;
    println!("   answer: {other} (logged as an error; the first body is kept)");

    println!("\n== 4. the warehouse is down: the event's job fails into a record, then is replayed");
    warehouse.down.store(true, Ordering::SeqCst);
    println!("   delivery: {}", deliver(event("evt_1004", 1004, 990), now(), stripe.clone()).await?);
    let worker = start_worker(&queue, &warehouse);
    let record = loop {
        if let Some(record) = queue.list(&FailureQuery::open()).await?.pop() {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    worker.shutdown().await;
    println!(
        "   record {}: {} attempts, last error {:?}, key {}",
        record.id, record.attempts, record.last_error, record.key
    );
    warehouse.down.store(false, Ordering::SeqCst);
    queue.replay(&record.id, "the warehouse is back", "ops@example.com").await?;
    let worker = start_worker(&queue, &warehouse);
    wait_until("the replayed order shipped", || warehouse.shipped.lock().unwrap().contains(&1004)).await;
    worker.shutdown().await;
    let shipped = warehouse.shipped.lock().unwrap().clone();
    println!("   orders shipped: {shipped:?}");
    assert_eq!(shipped, vec![1001, 1004], "each order once");
    Ok(())
}
