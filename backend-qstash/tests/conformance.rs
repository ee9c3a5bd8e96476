//! The whole conformance suite, both halves, against the QStash emulator: every delivery pushed
//! to a receiver on a real listener and verified, the effect ledger and the record store in
//! PostgreSQL as an application keeps them.

mod common;

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_postgres::PgBackend;
use redrive_qstash::QStashBackend;

async fn qstash() -> Subject<QStashBackend, PgBackend> {
    let rig = common::rig().await;
    let timing =
        Timing { lease: Duration::from_secs(1), settle: Duration::from_secs(2), timeout: Duration::from_secs(60) };
    let probe = rig.backend.clone();
    // The emulator lives as long as the test process: the subject holds only the backend. The
    // rest of the rig is dropped with the subject, so each test's ledger pool closes its
    // connections when the test ends (41 leaked pools of three exhaust PostgreSQL's 100).
    std::mem::forget(rig.emulator.clone());
    let (backend, ledger) = (rig.backend.clone(), rig.ledger.clone());
    drop(rig);
    // The ledger is the records store too, as in an application; QStash's DLQ keeps its own
    // copy of a record's payload.
    let forgetter = (backend.clone(), ledger.clone());
    Subject::new(backend, ledger, timing)
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text).await.expect("the DLQ and the store can be read") }
        })
        .forget(move |key| {
            let (backend, store) = forgetter.clone();
            async move {
                backend.forget_dlq_entries(&key).await?;
                store.forget_key(&key).await
            }
        })
}

redrive_conformance::suite!(qstash());
