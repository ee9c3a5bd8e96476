//! The whole conformance suite, both halves, on a SQLite file of its own per scenario.

mod common;

use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_sqlite::SqliteBackend;

async fn sqlite() -> Subject<SqliteBackend, SqliteBackend> {
    let (backend, dir) = common::backend().await;
    // The directory lives as long as the suite's scenario holds the probe.
    let probe = (backend.clone(), std::sync::Arc::new(dir));
    let forgetter = backend.clone();
    Subject::new(backend.clone(), backend, Timing::default())
        .storage(move |text| {
            let (backend, _dir) = probe.clone();
            async move { backend.holds_text(&text).await.expect("the storage probe reads every table") }
        })
        .forget(move |key| {
            let backend = forgetter.clone();
            async move { backend.forget_key(&key).await }
        })
}

redrive_conformance::suite!(sqlite());
