//! The whole conformance suite against a real PostgreSQL, each scenario in its own schema.

mod common;

use redrive_conformance::{Capabilities, Subject};
use redrive_postgres::PgBackend;

async fn postgres() -> Subject<PgBackend, PgBackend> {
    let backend = common::backend("conf").await;
    let caps = Capabilities { enqueue_dedupe: true, max_payload_bytes: 1024 * 1024, ..Capabilities::default() };
    Subject { queue: backend.clone(), ledger: backend, caps }
}

redrive_conformance::suite!(postgres());
