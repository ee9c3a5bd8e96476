//! The whole conformance suite, both halves, against moto's SQS server, each scenario on queues
//! of its own set up with the defaults, with the effect ledger in PostgreSQL as an application
//! keeps it.

mod common;

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_core::{Forget, Forgotten};
use redrive_postgres::PgBackend;
use redrive_sqs::{QueueSetup, SqsBackend};

async fn sqs() -> Subject<SqsBackend, PgBackend> {
    let records = common::ledger().await;
    let queue = common::queue_named(&common::name("conf"), QueueSetup::default(), records.clone()).await;
    let ledger = common::ledger().await;
    // SQS counts visibility in whole seconds: leases of a few, and room for them to lapse. Three
    // seconds, not two: on a loaded machine moto's answers to a deferral's copy and delete can
    // outlast two, and the message comes back as a new attempt (seen in `rate_limited`).
    let timing =
        Timing { lease: Duration::from_secs(3), settle: Duration::from_secs(4), timeout: Duration::from_secs(60) };
    let probe = queue.clone();
    let stores = (records, ledger.clone());
    Subject::new(queue, ledger, timing)
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text).await.expect("the queues can be read") }
        })
        // The records and the ledger are in two schemas here: the key is forgotten in both.
        .forget(move |key| {
            let (records, ledger) = stores.clone();
            async move {
                let (a, b) = (records.forget_key(&key).await?, ledger.forget_key(&key).await?);
                Ok(Forgotten { jobs: a.jobs + b.jobs, records: a.records + b.records, ledger: a.ledger + b.ledger })
            }
        })
}

redrive_conformance::suite!(sqs());
