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
//! file grows?), and two worker processes on one file (this bench run again as two children).
//! `REDRIVE_BENCH_JOBS` changes the size.
//!
//! The **breakdown** sums the backend's write transactions from its trace events (target
//! `redrive_sqlite::writes`): how many per thousand jobs, how long their statements and commits
//! held the writer, and how long the writer sat outside any transaction while the worker ran.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, Worker, WorkerConfig};
use redrive_sqlite::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use redrive_sqlite::sqlx::{self, Connection, Row};
use redrive_sqlite::{SqliteBackend, SqliteConfig, SqliteSynchronous};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

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

const WRITES: &str = "redrive_sqlite::writes";

/// One kind of write transaction, summed: how many, the jobs they wrote, and microseconds spent
/// waiting for the writer, running statements, and committing.
#[derive(Debug, Default, Clone, Copy)]
struct Writes {
    transactions: u64,
    jobs: u64,
    wait_us: u64,
    statements_us: u64,
    commit_us: u64,
}

/// The backend's write transactions by name ("claim", "complete"), summed since the last take.
static TALLY: Mutex<Option<HashMap<String, Writes>>> = Mutex::new(None);

fn take_tally() -> HashMap<String, Writes> {
    TALLY.lock().unwrap().take().unwrap_or_default()
}

/// Sums the backend's write events; every other event and span is turned off at its callsite,
/// so the worker pays nothing for the subscriber.
struct Tally;

impl<S: Subscriber> Layer<S> for Tally {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == WRITES { Interest::always() } else { Interest::never() }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == WRITES
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields(String, Writes);
        impl tracing::field::Visit for Fields {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "write" {
                    self.0 = value.to_owned();
                }
            }
            fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
                let w = &mut self.1;
                match field.name() {
                    "jobs" => w.jobs = value,
                    "wait_us" => w.wait_us = value,
                    "statements_us" => w.statements_us = value,
                    "commit_us" => w.commit_us = value,
                    _ => {}
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut tally = TALLY.lock().unwrap();
        let sum = tally.get_or_insert_with(HashMap::new).entry(fields.0).or_default();
        sum.transactions += 1;
        sum.jobs += fields.1.jobs;
        sum.wait_us += fields.1.wait_us;
        sum.statements_us += fields.1.statements_us;
        sum.commit_us += fields.1.commit_us;
    }
}

/// The worker's cost per job, from its write transactions over `jobs` jobs in `elapsed`.
fn breakdown(name: &str, tally: &HashMap<String, Writes>, jobs: u64, elapsed: Duration) {
    let per_thousand = |n: u64| n as f64 * 1000.0 / jobs as f64;
    let per_job = |us: u64| us as f64 / jobs as f64;
    let mut busy = 0;
    println!("  {name}: {:.1} µs a job in all", elapsed.as_micros() as f64 / jobs as f64);
    for write in ["claim", "complete"] {
        let w = tally.get(write).copied().unwrap_or_default();
        busy += w.statements_us + w.commit_us;
        println!(
            "    {write}: {:.1} transactions per 1000 jobs ({:.0} jobs each), statements {:.2} µs a job, commit {:.2} µs a job ({:.0} µs each)",
            per_thousand(w.transactions),
            w.jobs as f64 / w.transactions.max(1) as f64,
            per_job(w.statements_us),
            per_job(w.commit_us),
            w.commit_us as f64 / w.transactions.max(1) as f64,
        );
    }
    let idle = (elapsed.as_micros() as u64).saturating_sub(busy);
    println!(
        "    writer in a transaction {:.1} µs a job, outside one {:.1} µs a job ({:.0}% idle)",
        per_job(busy),
        per_job(idle),
        100.0 * idle as f64 / elapsed.as_micros().max(1) as f64
    );
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
/// empty; jobs a second. `verbose`: prints its cost per job.
async fn batched(dir: &std::path::Path, name: &str, jobs: u64, verbose: bool) -> BoxResult<f64> {
    let mut conn = raw(dir, name, jobs).await?;
    let claim = "UPDATE redrive_jobs
        SET status = 'running', ready_at = NULL, lease_token = ?1, lease_expires = ?2 + 30000,
            attempts = attempts + 1, claims = claims + 1
        WHERE id IN (SELECT id FROM redrive_jobs WHERE status = 'queued' AND ready_at <= ?2 ORDER BY ready_at, id LIMIT 100)
        RETURNING id";
    let complete = "UPDATE redrive_jobs SET status = 'done', lease_token = NULL, lease_expires = NULL, done_at = ?2
        WHERE id IN (SELECT value FROM json_each(?1)) AND lease_token = ?3";
    let started = Instant::now();
    let (mut done, mut transactions, mut statements) = (0u64, 0u64, Duration::ZERO);
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let token = uuid::Uuid::new_v4().to_string();
        let claimed = Instant::now();
        let ids: Vec<i64> =
            sqlx::query(claim).bind(&token).bind(now).fetch_all(&mut conn).await?.iter().map(|r| r.get(0)).collect();
        statements += claimed.elapsed();
        if ids.is_empty() {
            break;
        }
        let ids_json = serde_json::to_string(&ids)?;
        let completing = Instant::now();
        let completed = sqlx::query(complete).bind(ids_json).bind(now).bind(&token).execute(&mut conn).await?;
        statements += completing.elapsed();
        transactions += 2;
        done += completed.rows_affected();
    }
    let elapsed = started.elapsed();
    assert_eq!(done, jobs, "the batched baseline did every job");
    if verbose {
        println!(
            "  raw batched: {:.1} µs a job in all; {:.0} transactions per 1000 jobs (each its own statement), \
             statements with their commits {:.1} µs a job, outside them {:.1} µs a job",
            elapsed.as_micros() as f64 / jobs as f64,
            transactions as f64 * 1000.0 / jobs as f64,
            statements.as_micros() as f64 / jobs as f64,
            elapsed.saturating_sub(statements).as_micros() as f64 / jobs as f64
        );
    }
    Ok(jobs as f64 / elapsed.as_secs_f64())
}

/// The worker, default configuration at concurrency 8: jobs a second, and the tail from its
/// last handler call to the file showing every job done. `verbose`: prints its breakdown.
async fn worker(dir: &std::path::Path, name: &str, jobs: u64, verbose: bool) -> BoxResult<(f64, Duration)> {
    let (backend, _path) = backlog(dir, name, jobs).await?;
    take_tally();
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
    let tally = take_tally();
    running.shutdown().await;
    if verbose {
        breakdown("worker", &tally, jobs, elapsed);
    }
    Ok((jobs as f64 / elapsed.as_secs_f64(), tail))
}

/// Two worker processes on one file, each this bench run again as a child: jobs a second from
/// the moment both are open and told to go to the file showing every job done, and how many
/// each did.
async fn two_processes(dir: &std::path::Path, name: &str, jobs: u64) -> BoxResult<(f64, Vec<u64>)> {
    let (backend, path) = backlog(dir, name, jobs).await?;
    drop(backend);
    let mut children = Vec::new();
    for _ in 0..2 {
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .env("REDRIVE_BENCH_CHILD", &path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        assert_eq!(lines.next_line().await?.as_deref(), Some("open"), "the child opened the file");
        children.push((child, lines));
    }
    let options = SqliteConnectOptions::new().filename(&path).read_only(true);
    let mut look = sqlx::SqliteConnection::connect_with(&options).await?;
    let count = "SELECT count(*) FROM redrive_jobs WHERE status = 'done'";
    let started = Instant::now();
    for (child, _) in &mut children {
        child.stdin.as_mut().expect("piped").write_all(b"go\n").await?;
    }
    while (sqlx::query(count).fetch_one(&mut look).await?.get::<i64, _>(0) as u64) < jobs {
        assert!(started.elapsed() < Duration::from_secs(1200), "the workers stalled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let mut each = Vec::new();
    for (mut child, mut lines) in children {
        child.stdin.as_mut().expect("piped").write_all(b"stop\n").await?;
        let done = lines.next_line().await?.and_then(|line| line.parse().ok()).expect("the child's count");
        each.push(done);
        assert!(child.wait().await?.success(), "the child ended well");
    }
    Ok((jobs as f64 / elapsed.as_secs_f64(), each))
}

/// The child of [`two_processes`]: opens the file, says so, runs a worker from "go" to "stop",
/// then prints how many jobs it did.
async fn child(path: &str) -> BoxResult<()> {
    let backend = SqliteBackend::open(SqliteConfig::new(path).with_synchronous(synchronous())).await?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    println!("open");
    assert_eq!(stdin.next_line().await?.as_deref(), Some("go"));
    let running = Worker::builder(backend.clone(), backend.clone())
        .config(WorkerConfig { concurrency: 8, ..WorkerConfig::default() })
        .handle::<Noop>(|_job: Noop, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        .build()
        .start();
    assert_eq!(stdin.next_line().await?.as_deref(), Some("stop"));
    let done = running.stats().succeeded;
    running.shutdown().await;
    println!("{done}");
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if let Ok(path) = std::env::var("REDRIVE_BENCH_CHILD") {
        return child(&path).await;
    }
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Tally))?;
    let jobs = std::env::var("REDRIVE_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let quick = std::env::var("REDRIVE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir()?;
    println!("burn-down of {jobs} no-op jobs, synchronous = {:?}; three rounds", synchronous());
    let (mut per_job, mut batch, mut workers, mut tails) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=3 {
        per_job.push(baseline(dir.path(), &format!("per-job-{round}.db"), jobs).await?);
        batch.push(batched(dir.path(), &format!("batched-{round}.db"), jobs, round == 3).await?);
        let (rate, tail) = worker(dir.path(), &format!("worker-{round}.db"), jobs, round == 3).await?;
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
        let base = batched(dir.path(), "batched-large.db", large, false).await?;
        let (rate, tail) = worker(dir.path(), "worker-large.db", large, false).await?;
        println!(
            "backlog of {large}: raw batched {base:.0}/s, worker {rate:.0}/s ({:.2}×), tail {:.1} ms; the worker at {:.2}× its {jobs}-job median",
            rate / base,
            tail.as_secs_f64() * 1000.0,
            rate / median(workers.clone())
        );
    }
    let (rate, each) = two_processes(dir.path(), "two-processes.db", jobs).await?;
    println!(
        "two worker processes on one file: {rate:.0}/s ({:.2}× the median batched, {:.2}× one worker's median); jobs each: {each:?}",
        rate / median(batch.clone()),
        rate / median(workers.clone())
    );
    Ok(())
}
