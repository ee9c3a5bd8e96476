//! A database of its own for each test, in a temporary directory removed when it is dropped.

#![allow(dead_code, unreachable_pub)]

use redrive_sqlite::{SqliteBackend, SqliteConfig};

/// An open backend on a new file, and the directory that holds it.
pub async fn backend() -> (SqliteBackend, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let backend = SqliteBackend::open(SqliteConfig::new(dir.path().join("jobs.db"))).await.expect("open");
    (backend, dir)
}
