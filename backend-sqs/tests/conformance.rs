//! The whole conformance suite against moto's SQS server (started by `scripts/services`), each
//! scenario on queues of its own, with the effect ledger in PostgreSQL as an application keeps it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_conformance::{Capabilities, Subject};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn endpoint() -> String {
    std::env::var("REDRIVE_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

async fn sqs() -> Subject<SqsBackend, PgBackend> {
    let name = format!("rdt-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    // moto accepts any credentials; the SDK still wants some.
    let config = SqsConfig::new(&name)
        .with_endpoint(endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test");
    let queue = SqsBackend::setup(config, QueueSetup { max_receive_count: 6, ..QueueSetup::default() })
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required for these tests (run scripts/test): {e}"));
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdt_{}_sqs{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required for the effect ledger (run scripts/test)");
    ledger.migrate().await.expect("migrate");
    let caps = Capabilities {
        enqueue_dedupe: false,
        max_payload_bytes: queue.max_message_size(),
        lease: Duration::from_secs(2),
        short_lease: Duration::from_secs(1),
        settle: Duration::from_secs(3),
        ..Capabilities::default()
    };
    Subject { queue, ledger, caps }
}

redrive_conformance::suite!(sqs());
