//! The whole conformance suite on pgmq in this machine's PostgreSQL, each scenario on a queue of
//! its own, with the effect ledger and the failure records in the same database.

mod common;

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_pgmq::{PgBackend, PgmqBackend};

async fn pgmq() -> Subject<PgmqBackend, PgBackend> {
    let (queue, ledger) = common::queue("conf").await;
    // pgmq counts visibility in whole seconds: leases of a few, and room for them to lapse.
    let timing =
        Timing { lease: Duration::from_secs(2), settle: Duration::from_secs(3), timeout: Duration::from_secs(60) };
    let (probe, forgetter) = (queue.clone(), (queue.clone(), ledger.clone()));
    Subject::new(queue, ledger, timing)
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text).await.expect("the queue can be read") }
        })
        .forget(move |key| {
            let (queue, store) = forgetter.clone();
            async move {
                queue.forget_archived(&key).await?;
                store.forget_key(&key).await
            }
        })
}

redrive_conformance::suite!(pgmq());
