//! The SQLite backend's burn-down of 20k no-op jobs at concurrency 8, as a ratio to raw SQL in
//! the same round.
//!
//! ```text
//! cargo bench -p redrive-sqlite --bench throughput
//! ```
//!
//! Two raw-SQL baselines on one connection with the same durability settings (WAL,
//! `synchronous = FULL` unless `REDRIVE_BENCH_SYNC=normal`), over the same backlog in a file of
//! the same schema: **per job** (claim one, complete it, each statement its own transaction) and
//! **batched** (claim 100 in one statement, complete them in one: two transactions per 100 jobs,
//! the ceiling issue 31 measures against). Each file is new and checkpointed before it is burned
//! down. Three interleaved rounds of baseline per job, batched, worker; medians and ratios to
//! the same round's batched baseline. The worker's **tail** is the time from its last handler
//! call to the file showing every job done. Then, unless `REDRIVE_BENCH_QUICK=1`, the batched
//! baseline and the worker once more on a backlog ten times larger (does throughput hold as the
//! file grows?). `REDRIVE_BENCH_JOBS` changes the size.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A new backlog of `jobs`, and one connection to its file with the backend's durability
/// settings, for a raw-SQL baseline.
async fn raw(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<sqlx::SqliteConnection> {
    let (backend, path) = backlog(dir, name, jobs).await?;
    drop(backend);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous())
        .busy_timeout(Duration::from_secs(5));
    Ok(sqlx::SqliteConnection::connect_with(&options).await?)
}

/// Raw SQL: claim one, complete it, until the queue is empty; jobs a second.
async fn baseline(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<f64> {
    let mut conn = raw(dir, name, jobs).await?;
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

/// Raw SQL, batched: claim 100 in one statement, complete them in one, until the queue is
/// empty; jobs a second.
async fn batched(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<f64> {
    let mut conn = raw(dir, name, jobs).await?;
    let claim = "UPDATE redrive_jobs
        SET status = 'running', ready_at = NULL, lease_token = ?1, lease_expires = ?2 + 30000,
            attempts = attempts + 1, claims = claims + 1
        WHERE id IN (SELECT id FROM redrive_jobs WHERE status = 'queued' AND ready_at <= ?2 ORDER BY ready_at, id LIMIT 100)
        RETURNING id";
    let complete = "UPDATE redrive_jobs SET status = 'done', lease_token = NULL, lease_expires = NULL, done_at = ?2
        WHERE id IN (SELECT value FROM json_each(?1)) AND lease_token = ?3";
    let started = Instant::now();
    let mut done = 0u64;
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let token = uuid::Uuid::new_v4().to_string();
        let ids: Vec<i64> =
            sqlx::query(claim).bind(&token).bind(now).fetch_all(&mut conn).await?.iter().map(|r| r.get(0)).collect();
        if ids.is_empty() {
            break;
        }
        let ids_json = serde_json::to_string(&ids)?;
        let completed = sqlx::query(complete).bind(ids_json).bind(now).bind(&token).execute(&mut conn).await?;
        done += completed.rows_affected();
    }
    assert_eq!(done, jobs, "the batched baseline did every job");
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// The worker, default configuration at concurrency 8: jobs a second, and the tail from its
/// last handler call to the file showing every job done.
async fn worker(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<(f64, Duration)> {
    let (backend, _path) = backlog(dir, name, jobs).await?;
    let config = WorkerConfig { concurrency: 8, ..WorkerConfig::default() };
    let started = Instant::now();
    // Microseconds from `started` of the latest handler call.
    let last_call = Arc::new(AtomicU64::new(0));
    let calls = Arc::clone(&last_call);
    let running = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Noop>(move |_job: Noop, _ctx: JobContext| {
            calls.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            async { Ok::<_, JobError>(()) }
        })
        .build()
        .start();
    let count = "SELECT count(*) FROM redrive_jobs WHERE status = 'done'";
    loop {
        assert!(started.elapsed() < Duration::from_secs(1200), "the worker stalled");
        if running.stats().succeeded >= jobs
            && sqlx::query(count).fetch_one(backend.pool()).await?.get::<i64, _>(0) as u64 >= jobs
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let tail = elapsed.saturating_sub(Duration::from_micros(last_call.load(Ordering::Relaxed)));
    running.shutdown().await;
    Ok((jobs as f64 / elapsed.as_secs_f64(), tail))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let jobs = std::env::var("REDRIVE_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let quick = std::env::var("REDRIVE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir()?;
    println!("burn-down of {jobs} no-op jobs, synchronous = {:?}; three rounds", synchronous());
    let (mut per_job, mut batch, mut workers, mut tails) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=3 {
        per_job.push(baseline(dir.path(), &format!("per-job-{round}.db"), jobs).await?);
        batch.push(batched(dir.path(), &format!("batched-{round}.db"), jobs).await?);
        let (rate, tail) = worker(dir.path(), &format!("worker-{round}.db"), jobs).await?;
        workers.push(rate);
        tails.push(tail.as_secs_f64() * 1000.0);
        println!(
            "  round {round}: raw per job {:.0}/s, raw batched {:.0}/s, worker {rate:.0}/s ({:.2}× batched), tail {:.1} ms",
            per_job[round - 1],
            batch[round - 1],
            rate / batch[round - 1],
            tails[round - 1]
        );
    }
    let ratios: Vec<f64> = workers.iter().zip(&batch).map(|(w, b)| w / b).collect();
    println!("| cell | round 1 | round 2 | round 3 | median | ratio to batched |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, values) in [
        ("raw SQL, claim + complete per job", &per_job),
        ("raw SQL, batched 100", &batch),
        ("worker, concurrency 8", &workers),
    ] {
        let per_round: Vec<f64> = values.iter().zip(&batch).map(|(v, b)| v / b).collect();
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}× |",
            values[0],
            values[1],
            values[2],
            median(values.clone()),
            median(per_round)
        );
    }
    println!("worker / batched per round: {ratios:.2?}; tail after the last handler: {tails:.1?} ms");
    if !quick {
        let large = jobs * 10;
        let base = batched(dir.path(), "batched-large.db", large).await?;
        let (rate, tail) = worker(dir.path(), "worker-large.db", large).await?;
        println!(
            "backlog of {large}: raw batched {base:.0}/s, worker {rate:.0}/s ({:.2}×), tail {:.1} ms; the worker at {:.2}× its {jobs}-job median",
            rate / base,
            tail.as_secs_f64() * 1000.0,
            rate / median(workers.clone())
        );
    }
    Ok(())
}
