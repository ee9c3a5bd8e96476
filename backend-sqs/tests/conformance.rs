//! The whole conformance suite, both halves, against moto's SQS server, each scenario on queues
//! of its own set up with the defaults, with the effect ledger in PostgreSQL as an application
//! keeps it.

mod common;

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_postgres::PgBackend;
use redrive_sqs::{QueueSetup, SqsBackend};

async fn sqs() -> Subject<SqsBackend, PgBackend> {
    let queue = common::queue("conf", QueueSetup::default()).await;
    // SQS counts visibility in whole seconds: leases of a few, and room for them to lapse.
    let timing =
        Timing { lease: Duration::from_secs(2), settle: Duration::from_secs(3), timeout: Duration::from_secs(60) };
    let probe = queue.clone();
    Subject::new(queue, common::ledger().await, timing).storage(move |text| {
        let probe = probe.clone();
        async move { probe.holds_text(&text).await.expect("the queues can be read") }
    })
}

redrive_conformance::suite!(sqs());
