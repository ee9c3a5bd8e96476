//! The four checks of reliable jobs on pgmq (Supabase Queues), its queue in the same PostgreSQL
//! database as the effect ledger and the failure records, read back from there.
//!
//! Run: `eval "$(scripts/services env)" && cargo run -p redrive-examples --example pgmq --features pgmq`
//! (`DATABASE_URL` names a database with pgmq installed: `scripts/services` installs it in `test`).

#[path = "broker/mod.rs"]
mod broker;

use redrive::pgmq::{PgmqBackend, PgmqConfig};
use redrive::postgres::{PgBackend, PgConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The effect ledger and the failure records live in the same database as pgmq's queue.
    let ledger = PgBackend::connect(PgConfig::from_env()?.with_schema("redrive_example_pgmq")).await?;
    redrive::postgres::sqlx::query("DROP SCHEMA IF EXISTS redrive_example_pgmq CASCADE").execute(ledger.pool()).await?;
    // A fresh queue on every run.
    redrive::postgres::sqlx::query("SELECT pgmq.drop_queue('redrive_example') WHERE EXISTS (SELECT 1 FROM pgmq.meta WHERE queue_name = 'redrive_example')")
        .execute(ledger.pool())
        .await?;
    ledger.migrate().await?;
    let queue = PgmqBackend::setup(PgmqConfig::new("redrive_example"), ledger.clone()).await?;
    println!(
        "pgmq queue {} (pgmq.q_{0}), ledger and failure records in schema redrive_example_pgmq",
        queue.queue_name()
    );
    broker::four_checks(&queue, &ledger).await
}
