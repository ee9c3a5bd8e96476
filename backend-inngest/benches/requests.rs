//! Requests per job on Inngest, counted by the emulator: events sent per job with
//! `enqueue_batch` (100 events a request), and calls per job for a burn-down where every job
//! succeeds first time, and one where every job fails once and is retried.
//!
//! ```text
//! eval "$(scripts/services env)"; cargo bench -p redrive-inngest --bench requests
//! ```
//!
//! Counts, not times: the same on any machine. `REDRIVE_BENCH_JOBS` changes the size (2,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, Worker, WorkerConfig};
use redrive_inngest::{InngestBackend, InngestConfig};
use redrive_inngest_emulator::Emulator;
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
    fail_once: bool,
}

impl Job for Noop {
    const KIND: &'static str = "noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n).fact("fail_once", self.fail_once)
    }
}

async fn cell(emulator: &Arc<Emulator>, jobs: u64, fail_once: bool) -> BoxResult<(f64, f64)> {
    let schema = format!("redrive_bench_inngest_{}", u8::from(fail_once));
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(&schema)).await?;
    redrive_postgres::sqlx::query(redrive_postgres::sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(ledger.pool())
    .await?;
    ledger.migrate().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let serve_url = format!("http://{}/api/inngest", listener.local_addr()?);
    let config = InngestConfig::new(emulator.event_key(), emulator.signing_key(), &serve_url)
        .with_base_url(emulator.url())
        .with_app_id(format!("bench-{}", u8::from(fail_once)))
        .allow_plain_http();
    let queue = InngestBackend::connect(config, Arc::new(ledger.clone())).await?;
    let app = axum::Router::new().route("/api/inngest", queue.endpoint());
    tokio::spawn(async move { axum::serve(listener, app).await });
    queue.sync().await?;
    let calls_before = emulator.calls().len();
    let batch: Vec<NewJob> = (0..jobs).map(|n| NewJob::from_job(&Noop { n, fail_once })).collect::<Result<_, _>>()?;
    queue.enqueue_batch(batch).await?;
    let events_per_job = queue.event_requests() as f64 / jobs as f64;
    let failed = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let running = Worker::builder(queue.clone(), ledger.clone())
        .config(WorkerConfig { concurrency: 16, ..WorkerConfig::default() })
        .handle::<Noop>(move |job: Noop, _ctx: JobContext| {
            let first = job.fail_once && failed.lock().unwrap().insert(job.n);
            async move { if first { Err(JobError::retry("once")) } else { Ok(()) } }
        })
        .build()
        .start();
    let started = Instant::now();
    while running.stats().succeeded < jobs {
        assert!(started.elapsed() < Duration::from_secs(600), "the burn-down stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.shutdown().await;
    let calls = emulator.calls().len() - calls_before;
    Ok((events_per_job, calls as f64 / jobs as f64))
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let jobs = std::env::var("REDRIVE_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let emulator = Arc::new(Emulator::builder().time_scale(0.001).start_local().await?);
    println!("{jobs} jobs, enqueue_batch, worker at concurrency 16, on the Inngest emulator");
    for (name, fail_once) in [("every job succeeds first time", false), ("every job fails once, then succeeds", true)] {
        let (events, calls) = cell(&emulator, jobs, fail_once).await?;
        println!("  {name}: event API requests per job {events:.4}, calls per job {calls:.2}");
    }
    Ok(())
}
