//! The whole conformance suite, both halves, against the Inngest emulator: every call pushed to
//! the serve endpoint on a real listener and verified, the effect ledger and the record store in
//! PostgreSQL as an application keeps them.

mod common;

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_inngest::InngestBackend;
use redrive_postgres::PgBackend;

async fn inngest() -> Subject<InngestBackend, PgBackend> {
    let rig = common::rig().await;
    let timing =
        Timing { lease: Duration::from_secs(1), settle: Duration::from_secs(2), timeout: Duration::from_secs(60) };
    let probe = rig.backend.clone();
    // The emulator lives as long as the test process: the subject holds only the backend.
    std::mem::forget(rig.emulator.clone());
    let (backend, ledger) = (rig.backend.clone(), rig.ledger.clone());
    drop(rig);
    // The ledger is the records store too, as in an application.
    let store = ledger.clone();
    Subject::new(backend, ledger, timing)
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text).await.expect("the store can be read") }
        })
        .forget(move |key| {
            let store = store.clone();
            async move { store.forget_key(&key).await }
        })
}

redrive_conformance::suite!(inngest());
