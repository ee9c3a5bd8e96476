//! What the dashboard's tests share: a migrated PostgreSQL schema of their own, failure records
//! in it, and a dashboard served on a loopback port.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, IdempotencyKey, NewJob, Severity};
use redrive_dashboard::Dashboard;
use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own (named so that the Postgres tests' clean-up drops it later).
pub async fn database() -> PgBackend {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let schema = format!("rdt_{}_{}_{nanos:x}_dash", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let backend = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(4))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    backend.migrate().await.expect("migrate");
    backend
}

pub fn job(kind: &str, n: u32, severity: Severity) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    let mut job = NewJob::new(kind, key, serde_json::json!({ "n": n, "note": format!("<b>parcel</b> {n}") })).unwrap();
    job.severity = severity;
    job
}

/// Jobs that fail for good: enqueued, claimed, recorded with `error`.
pub async fn fail(backend: &PgBackend, jobs: Vec<NewJob>, error: &str) {
    let n = jobs.len();
    backend.enqueue_batch(jobs).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, n, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
    assert_eq!(claimed.len(), n);
    for c in &claimed {
        backend.dead_letter(c, error).await.unwrap();
    }
}

/// Serves `dashboard` on a free loopback port; its base URL.
pub async fn serve(dashboard: Dashboard<PgBackend>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(dashboard.serve(listener, std::future::pending()));
    url
}

/// The CSRF token in a page's forms.
pub fn csrf(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a form with a CSRF field") + 19;
    page[start..].split('"').next().unwrap().to_owned()
}
