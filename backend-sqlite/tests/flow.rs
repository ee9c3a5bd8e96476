//! `SqliteBackend` as a flow store: the checks every store passes, each on a file of its own,
//! opened twice (two writers and their readers, as two processes would have).

use redrive_sqlite::{SqliteBackend, SqliteConfig};

async fn two_handles() -> (SqliteBackend, SqliteBackend, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("jobs.db");
    let first = SqliteBackend::open(SqliteConfig::new(&path)).await.expect("open");
    let second = SqliteBackend::open(SqliteConfig::new(&path)).await.expect("open again");
    (first, second, dir)
}

redrive_conformance::flow_store_checks!(two_handles());
