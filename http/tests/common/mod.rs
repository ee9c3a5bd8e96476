//! What the HTTP crate's tests share: a PostgreSQL schema of their own (a missing server fails
//! the test; it never skips), and waiting for a condition.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A name unique across processes and runs: schemas are kept in the test database.
pub fn unique_schema(label: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("rdt_{}_{}_{nanos:x}_{label}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Connects to `schema` (made by the parent process, or to be migrated).
pub async fn connect(schema: &str) -> PgBackend {
    PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(4))
        .await
        .expect("PostgreSQL is required (run scripts/test)")
}

/// A migrated schema of its own.
pub async fn database(label: &str) -> PgBackend {
    let backend = connect(&unique_schema(label)).await;
    backend.migrate().await.expect("migrate");
    backend
}

/// Waits (`secs` at most) until `done` holds.
pub async fn until(what: &str, secs: u64, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
