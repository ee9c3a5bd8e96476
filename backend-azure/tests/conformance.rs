//! The whole conformance suite, both halves, against Azurite, each scenario on queues of its
//! own, with the effect ledger and the failure records in PostgreSQL as an application keeps them.

mod common;

use std::time::Duration;

use redrive_azure::{AzureBackend, QueueOptions};
use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_postgres::PgBackend;

async fn azure() -> Subject<AzureBackend, PgBackend> {
    let (queue, ledger) = common::queue("conf", QueueOptions::default()).await;
    // Azure counts visibility in whole seconds: leases of a few, and room for them to lapse.
    let timing =
        Timing { lease: Duration::from_secs(2), settle: Duration::from_secs(3), timeout: Duration::from_secs(60) };
    let probe = queue.clone();
    // The ledger is the records store too, as in an application.
    let forgetter = ledger.clone();
    Subject::new(queue, ledger, timing)
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text).await.expect("the queues can be read") }
        })
        .forget(move |key| {
            let store = forgetter.clone();
            async move { store.forget_key(&key).await }
        })
}

redrive_conformance::suite!(azure());
