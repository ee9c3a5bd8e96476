//! The four checks of reliable jobs on Amazon SQS (here moto's server), with the effect ledger
//! in PostgreSQL as an application keeps it, and the failure record read back from there.
//!
//! Run: `eval "$(scripts/services env)" && cargo run -p redrive-examples --example sqs --features sqs`

#[path = "broker/mod.rs"]
mod broker;

use redrive::postgres::{PgBackend, PgConfig};
use redrive::sqs::{QueueSetup, SqsBackend, SqsConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A queue of its own on every run (moto keeps queues for as long as it runs).
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let name = format!("redrive-example-{}-{nanos:x}", std::process::id());
    let config = SqsConfig::new(&name).with_static_credentials("test", "test").with_region("us-east-1");
    // The effect ledger and the failure records live in the application's database.
    let ledger = PgBackend::connect(PgConfig::from_env()?.with_schema("redrive_example_sqs")).await?;
    redrive::postgres::sqlx::query("DROP SCHEMA IF EXISTS redrive_example_sqs CASCADE").execute(ledger.pool()).await?;
    ledger.migrate().await?;
    let queue = SqsBackend::setup(config, QueueSetup::default(), ledger.clone()).await?;
    println!(
        "queue {name}, its DLQ {name}-dlq (maxReceiveCount {}), ledger and failure records in PostgreSQL",
        queue.max_receive_count()
    );
    broker::four_checks(&queue, &ledger).await
}
