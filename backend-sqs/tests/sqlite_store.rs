//! An SQS worker with no PostgreSQL: its effect ledger and failure records in a SQLite file
//! (`redrive-sqlite`). The scenarios that exercise the ledger and the record store: failures
//! recorded, a replay, a purge that forgets, racing replays and alerts.

use std::time::Duration;

use redrive_conformance::{Subject, Timing, check};
use redrive_sqlite::{SqliteBackend, SqliteConfig};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};

async fn sqs_on_sqlite() -> (Subject<SqsBackend, SqliteBackend>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteBackend::open(SqliteConfig::new(dir.path().join("app.db"))).await.unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let name = format!("rdt-sqlite-{}-{nanos:x}", std::process::id());
    let endpoint = std::env::var("REDRIVE_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    let config = SqsConfig::new(&name)
        .with_endpoint(endpoint)
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO);
    let queue = SqsBackend::setup(config, QueueSetup::default(), store.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required for these tests (run scripts/test): {e}"));
    let timing =
        Timing { lease: Duration::from_secs(2), settle: Duration::from_secs(3), timeout: Duration::from_secs(60) };
    let probe = queue.clone();
    let subject = Subject::new(queue, store, timing).storage(move |text| {
        let probe = probe.clone();
        async move { probe.holds_text(&text).await.expect("the queues can be read") }
    });
    (subject, dir)
}

macro_rules! scenarios {
    ($($name:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (subject, _dir) = sqs_on_sqlite().await;
            check(redrive_conformance::$name(subject).await);
        }
    )*};
}

scenarios!(replay exhaust recover racing_replays purge_forgets alert_delivery provider_key_once);
