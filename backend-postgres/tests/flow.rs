//! `PgBackend` as a flow store: the checks every store passes, each on a schema of its own, with
//! two backends (two pools, as two worker processes would have) on it.

mod common;

use redrive_postgres::{PgBackend, PgConfig};

async fn two_handles() -> (PgBackend, PgBackend) {
    let first = common::backend("flow").await;
    let config = PgConfig::new(common::database_url()).with_schema(first.schema()).with_max_connections(6);
    (first, common::backend_with(config).await)
}

redrive_conformance::flow_store_checks!(two_handles());
