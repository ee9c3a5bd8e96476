//! The whole conformance suite against moto's SQS server, each scenario on queues of its own,
//! with the effect ledger in PostgreSQL as an application keeps it.

mod common;

use std::time::Duration;

use redrive_conformance::{Capabilities, Subject};
use redrive_postgres::PgBackend;
use redrive_sqs::{QueueSetup, SqsBackend};

async fn sqs() -> Subject<SqsBackend, PgBackend> {
    let queue = common::queue("conf", QueueSetup { max_receive_count: 6, ..QueueSetup::default() }).await;
    let caps = Capabilities {
        enqueue_dedupe: false,
        max_payload_bytes: queue.max_message_size(),
        lease: Duration::from_secs(2),
        short_lease: Duration::from_secs(1),
        settle: Duration::from_secs(3),
        ..Capabilities::default()
    };
    Subject { queue, ledger: common::ledger().await, caps }
}

redrive_conformance::suite!(sqs());
