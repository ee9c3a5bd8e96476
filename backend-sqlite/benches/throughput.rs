//! The SQLite backend's burn-down of 20k no-op jobs at concurrency 8, as a ratio to raw SQL in
//! the same run.
//!
//! ```text
//! cargo bench -p redrive-sqlite --bench throughput
//! ```
//!
//! The baseline is a loop of the claim and complete statements on one connection with the same
//! durability settings (WAL, `synchronous = FULL` unless `REDRIVE_BENCH_SYNC=normal`), each
//! statement its own transaction, over the same backlog in a file of the same schema. Each file
//! is new and checkpointed before it is burned down. Order: baseline, worker, worker, baseline;
//! the worker's rate is divided by the mean of the two baselines, and every run is printed, so
//! that drift within the round shows. `REDRIVE_BENCH_JOBS` changes the size.

use std::time::{Duration, Instant};

use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, Worker, WorkerConfig};
use redrive_sqlite::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use redrive_sqlite::sqlx::{self, Connection, Row};
use redrive_sqlite::{SqliteBackend, SqliteConfig, SqliteSynchronous};
use serde::{Deserialize, Serialize};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl Job for Noop {
    const KIND: &'static str = "noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

fn synchronous() -> SqliteSynchronous {
    match std::env::var("REDRIVE_BENCH_SYNC").as_deref() {
        Ok("normal") => SqliteSynchronous::Normal,
        _ => SqliteSynchronous::Full,
    }
}

/// A new file with `jobs` queued no-op jobs, checkpointed.
async fn backlog(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<(SqliteBackend, std::path::PathBuf)> {
    let path = dir.join(name);
    let backend = SqliteBackend::open(SqliteConfig::new(&path).with_synchronous(synchronous())).await?;
    for start in (0..jobs).step_by(1000) {
        let chunk =
            (start..(start + 1000).min(jobs)).map(|n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
        backend.enqueue_batch(chunk).await?;
    }
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(backend.pool()).await?;
    Ok((backend, path))
}

/// Raw SQL: claim one, complete it, until the queue is empty; jobs a second.
async fn baseline(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<f64> {
    let (backend, path) = backlog(dir, name, jobs).await?;
    drop(backend);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous())
        .busy_timeout(Duration::from_secs(5));
    let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
    let claim = "UPDATE redrive_jobs
        SET status = 'running', ready_at = NULL, lease_token = ?1, lease_expires = ?2 + 30000,
            attempts = attempts + 1, claims = claims + 1
        WHERE id = (SELECT id FROM redrive_jobs WHERE status = 'queued' AND ready_at <= ?2 ORDER BY ready_at, id LIMIT 1)
        RETURNING id";
    let complete = "UPDATE redrive_jobs SET status = 'done', lease_token = NULL, lease_expires = NULL, done_at = ?2
        WHERE id = ?1 AND lease_token = ?3";
    let started = Instant::now();
    let mut done = 0u64;
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let token = uuid::Uuid::new_v4().to_string();
        let Some(row) = sqlx::query(claim).bind(&token).bind(now).fetch_optional(&mut conn).await? else { break };
        let id: i64 = row.get(0);
        sqlx::query(complete).bind(id).bind(now).bind(&token).execute(&mut conn).await?;
        done += 1;
    }
    assert_eq!(done, jobs, "the baseline did every job");
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// The worker, default configuration at concurrency 8; jobs a second.
async fn worker(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<f64> {
    let (backend, _path) = backlog(dir, name, jobs).await?;
    let config = WorkerConfig { concurrency: 8, ..WorkerConfig::default() };
    let started = Instant::now();
    let running = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Noop>(|_job: Noop, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        .build()
        .start();
    while running.stats().succeeded < jobs {
        assert!(started.elapsed() < Duration::from_secs(600), "the worker stalled");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    running.shutdown().await;
    Ok(rate)
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let jobs = std::env::var("REDRIVE_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let dir = tempfile::tempdir()?;
    println!("burn-down of {jobs} no-op jobs, synchronous = {:?}", synchronous());
    let first = baseline(dir.path(), "baseline-1.db", jobs).await?;
    println!("  raw SQL, claim + complete per job   {first:>9.0} jobs/s");
    let mut rates = Vec::new();
    for run in 1..=2 {
        let rate = worker(dir.path(), &format!("worker-{run}.db"), jobs).await?;
        println!("  worker, concurrency 8, run {run}        {rate:>9.0} jobs/s");
        rates.push(rate);
    }
    let last = baseline(dir.path(), "baseline-2.db", jobs).await?;
    println!("  raw SQL, again                      {last:>9.0} jobs/s");
    let base = (first + last) / 2.0;
    for (run, rate) in rates.iter().enumerate() {
        println!("  worker run {} / baseline            {:>9.2}×", run + 1, rate / base);
    }
    Ok(())
}
