//! Azurite (started by `scripts/services`) and PostgreSQL for the effect ledger and the record
//! store. A missing service fails the test; it never skips.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};

use redrive_azure::{AzureBackend, AzureConfig, QueueOptions};
use redrive_core::kit::RecordStore;
use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Unique across runs too: Azurite keeps queues for as long as it runs, and process ids repeat.
fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}-{}-{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A unique queue name for this test (Azure's rules: lower case, digits and single dashes).
pub fn name(label: &str) -> String {
    format!("rdt-{label}-{}", unique())
}

pub fn config() -> AzureConfig {
    match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
        Ok(text) => AzureConfig::from_connection_string(&text).expect("a valid connection string"),
        Err(_) => AzureConfig::development(),
    }
}

/// A queue and its poison queue set up for this test, with its records in a PostgreSQL schema
/// of its own.
pub async fn queue(label: &str, options: QueueOptions) -> (AzureBackend, PgBackend) {
    let store = store().await;
    (queue_named(&name(label), options, store.clone()).await, store)
}

/// The queue `name`, with its records in `records`.
pub async fn queue_named(name: &str, options: QueueOptions, records: impl RecordStore) -> AzureBackend {
    AzureBackend::setup(&config(), name, options, records)
        .await
        .unwrap_or_else(|e| panic!("Azurite is required for these tests (run scripts/test): {e}"))
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own: the effect ledger and the record store.
pub async fn store() -> PgBackend {
    let schema = format!("rdt_{}_az", unique().replace('-', "_"));
    let store = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required for the effect ledger (run scripts/test)");
    store.migrate().await.expect("migrate");
    store
}
