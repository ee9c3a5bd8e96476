//! moto's SQS server (started by `scripts/services`) and PostgreSQL for the effect ledger. A
//! missing service fails the test; it never skips.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn endpoint() -> String {
    std::env::var("REDRIVE_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// Unique across runs too: moto keeps queues for as long as it runs, and process ids repeat.
fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}-{}-{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A unique queue name for this test.
pub fn name(label: &str) -> String {
    format!("rdt-{}-{label}", unique())
}

/// moto accepts any credentials; the SDK still wants some.
pub fn config(name: &str) -> SqsConfig {
    SqsConfig::new(name)
        .with_endpoint(endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO)
}

/// A queue pair set up for this test, with its records in a PostgreSQL schema of its own.
pub async fn queue(label: &str, setup: QueueSetup) -> SqsBackend {
    queue_named(&name(label), setup, ledger().await).await
}

/// The queue `name`, with its records in `store` (another process's view of a queue is the same
/// name and store).
pub async fn queue_named(name: &str, setup: QueueSetup, store: PgBackend) -> SqsBackend {
    SqsBackend::setup(config(name), setup, store)
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required for these tests (run scripts/test): {e}"))
}

/// A raw SDK client on moto, for what the backend would never do itself.
pub async fn raw_client() -> aws_sdk_sqs::Client {
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("test", "test", None, None, "tests"))
        .load()
        .await;
    aws_sdk_sqs::Client::new(&shared)
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own: the effect ledger, and the record store of the queues made with it.
pub async fn ledger() -> PgBackend {
    let url = database_url();
    let schema = format!("rdt_{}_sqs", unique().replace('-', "_"));
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required for the effect ledger (run scripts/test)");
    ledger.migrate().await.expect("migrate");
    ledger
}
