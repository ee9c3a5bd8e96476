//! PostgreSQL with pgmq installed (by `scripts/services`) for the queue, the effect ledger and
//! the records. A missing service fails the test; it never skips.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};

use redrive_pgmq::{PgmqBackend, PgmqConfig};
use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Unique across runs too: queues are kept in the test database.
pub fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}_{}_{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own: the effect ledger and the record store.
pub async fn store() -> PgBackend {
    let schema = format!("rdt_{}_mq", unique());
    let store = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(4))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    store.migrate().await.expect("migrate");
    store
}

/// A pgmq queue of its own, with its records and ledger in a schema of its own.
pub async fn queue(label: &str) -> (PgmqBackend, PgBackend) {
    let store = store().await;
    let name = format!("rdt_{label}_{}", unique());
    let queue = PgmqBackend::setup(PgmqConfig::new(name), store.clone())
        .await
        .unwrap_or_else(|e| panic!("pgmq is required in the test database (run scripts/services): {e}"));
    (queue, store)
}
