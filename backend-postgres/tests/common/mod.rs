//! Test databases: a fresh schema per test on the real PostgreSQL that `scripts/services`
//! starts. A missing database fails the test; it never skips.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::{Job, JobContext, JobError, KeyBuilder, NewJob, RunningWorker, Worker, WorkerConfig};
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use tokio::sync::OnceCell;

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

static CLEANED: OnceCell<()> = OnceCell::const_new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// Drops the schemas earlier test processes left behind (their pid is gone).
async fn drop_stale_schemas(pool: &sqlx::PgPool) {
    let rows = sqlx::query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rdt\\_%'")
        .fetch_all(pool)
        .await
        .expect("list test schemas");
    for row in rows {
        let name: String = row.get(0);
        let pid: Option<u32> = name.split('_').nth(1).and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")))
                .execute(pool)
                .await;
        }
    }
}

/// A migrated backend on a schema of its own, with quick sweeps for the lease tests.
pub async fn backend(label: &str) -> PgBackend {
    // The time makes it unique across runs too (process ids repeat).
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let schema = format!("rdt_{}_{n}_{nanos:x}_{label}", std::process::id());
    let config = PgConfig::new(database_url())
        .with_schema(schema)
        .with_max_connections(6)
        .with_sweep_every(Duration::from_millis(100))
        .with_poll(Duration::from_millis(200));
    backend_with(config).await
}

pub async fn backend_with(config: PgConfig) -> PgBackend {
    let backend = PgBackend::connect(config).await.unwrap_or_else(|e| {
        panic!("PostgreSQL is required for these tests (run scripts/test, or set DATABASE_URL): {e}")
    });
    CLEANED.get_or_init(|| drop_stale_schemas(backend.pool())).await;
    backend.migrate().await.expect("migrate");
    backend
}

/// The job the fault tests run: one charge per order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charge {
    pub order: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

pub fn charge(order: u32) -> NewJob {
    NewJob::from_job(&Charge { order }).unwrap()
}

/// A worker on `backend` (2 s lease, heartbeat) whose handler takes `work` and then counts the
/// order's effect: effects by order, to check every job done once after a fault.
pub fn counting_worker(backend: &PgBackend, work: Duration) -> (RunningWorker, Arc<Mutex<HashMap<u32, u32>>>) {
    let effects: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let seen = Arc::clone(&effects);
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        heartbeat: Some(Duration::from_millis(600)),
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            let seen = Arc::clone(&seen);
            async move {
                tokio::time::sleep(work).await;
                *seen.lock().unwrap().entry(job.order).or_default() += 1;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    (worker, effects)
}

pub async fn wait_for(what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
