//! The four checks of reliable jobs on Azure Queue Storage (here Azurite), with the effect ledger
//! in PostgreSQL as an application keeps it, and the failure record read back from there.
//!
//! Run: `eval "$(scripts/services env)" && cargo run -p redrive-examples --example azure --features azure`
//! (`AZURE_STORAGE_CONNECTION_STRING` names the account; without it, Azurite's development one).

#[path = "broker/mod.rs"]
mod broker;

use redrive::azure::{AzureBackend, AzureConfig, QueueOptions};
use redrive::postgres::{PgBackend, PgConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A queue of its own on every run (Azurite keeps queues for as long as it runs).
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let name = format!("redrive-example-{}-{nanos:x}", std::process::id());
    let account = match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
        Ok(text) => AzureConfig::from_connection_string(&text)?,
        Err(_) => AzureConfig::development(),
    };
    // The effect ledger and the failure records live in the application's database.
    let ledger = PgBackend::connect(PgConfig::from_env()?.with_schema("redrive_example_azure")).await?;
    redrive::postgres::sqlx::query("DROP SCHEMA IF EXISTS redrive_example_azure CASCADE")
        .execute(ledger.pool())
        .await?;
    ledger.migrate().await?;
    let queue = AzureBackend::setup(&account, &name, QueueOptions::default(), ledger.clone()).await?;
    println!(
        "queue {name} on {}, its poison queue {}, ledger and failure records in PostgreSQL",
        account.account(),
        queue.poison_queue_name()
    );
    broker::four_checks(&queue, &ledger).await
}
