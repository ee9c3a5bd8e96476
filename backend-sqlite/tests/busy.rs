//! A busy database: worker processes beside another process's long writes, a large purge while a
//! worker completes jobs, and a row that does not read back.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redrive_core::{
    DeadLetter, Enqueue, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStatsExt, RunningWorker,
    Worker, WorkerConfig,
};
use redrive_sqlite::sqlx::{self, Connection};
use redrive_sqlite::{SqliteBackend, SqliteConfig, SqliteSynchronous};

/// A parcel to ship: its effect is a line appended to a file outside the database (as a call to
/// a carrier would be), so only the job's completion says it was done.
#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn ship(n: u32) -> NewJob {
    NewJob::from_job(&Ship { parcel: n }).unwrap()
}

/// A worker that appends its job's key to `effects`, one line per effect (no unique anything).
fn shipping_worker(backend: &SqliteBackend, effects: PathBuf, config: WorkerConfig) -> RunningWorker {
    Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ship>(move |job: Ship, ctx: JobContext| {
            let effects = effects.clone();
            async move {
                // A call that takes a while: its completion lands anywhere in the long writer's
                // cycle, not only just after the claim that found the lock free.
                tokio::time::sleep(Duration::from_millis(50 + u64::from(job.parcel % 8) * 40)).await;
                let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&effects).unwrap();
                // One write of one line: appends from two processes do not interleave.
                file.write_all(format!("{}\n", ctx.key).as_bytes()).unwrap();
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

/// Effects per key, from the file.
fn effects(path: &Path) -> HashMap<String, usize> {
    let mut per_key = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *per_key.entry(line.to_owned()).or_default() += 1;
    }
    per_key
}

const JOBS: u32 = 200;
const TWO_PROCESSES: &str = "two_worker_processes_beside_a_long_writer_do_every_effect_once";

/// Another program holding the write lock longer than the workers' busy timeout, again and
/// again: 700 ms of every 850. Every write of the workers (claims, renewals, completions) meets
/// it; a completion refused as busy must be tried again while its job's lease is kept.
async fn long_writer(path: PathBuf, stop: Arc<AtomicBool>) {
    let url = format!("sqlite://{}", path.display());
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut other).await.unwrap();
    while !stop.load(Ordering::SeqCst) {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

fn worker_process(db: &Path, effects: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([TWO_PROCESSES, "--exact", "--nocapture", "--test-threads=1"])
        .env("REDRIVE_SQLITE_BUSY_DB", db)
        .env("REDRIVE_SQLITE_BUSY_EFFECTS", effects)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The same test binary plays the two worker processes: run with the child variables set, it
/// works the queue until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_beside_a_long_writer_do_every_effect_once() {
    let busy_timeout = Duration::from_millis(200);
    if let (Ok(db), Ok(effects)) =
        (std::env::var("REDRIVE_SQLITE_BUSY_DB"), std::env::var("REDRIVE_SQLITE_BUSY_EFFECTS"))
    {
        let backend = SqliteBackend::open(SqliteConfig::new(db).with_busy_timeout(busy_timeout)).await.unwrap();
        let config = WorkerConfig { concurrency: 8, lease: Duration::from_secs(5), ..WorkerConfig::default() };
        let _worker = shipping_worker(&backend, effects.into(), config);
        tokio::time::sleep(Duration::from_secs(600)).await;
        panic!("the worker process should have been killed");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, effects_file) = (dir.path().join("jobs.db"), dir.path().join("effects.log"));
    let backend = SqliteBackend::open(SqliteConfig::new(&db)).await.unwrap();
    backend.enqueue_batch((1..=JOBS).map(ship).collect()).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(long_writer(db.clone(), Arc::clone(&stop)));
    let mut workers = [worker_process(&db, &effects_file), worker_process(&db, &effects_file)];
    // Drained: every job done, none running (a job whose completion was lost is `running` until
    // its lease lapses and a claim takes it again, to run it a second time).
    let left = backend.wait_until_drained(Duration::from_secs(120)).await.unwrap();
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    for worker in &mut workers {
        worker.kill().unwrap();
        worker.wait().unwrap();
    }
    assert!(left.is_drained(), "every job done: {left:?}");
    let effects = effects(&effects_file);
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "effects repeated: {twice:?}");
    assert_eq!(effects.len(), JOBS as usize, "every job's effect");
    assert_eq!(backend.count_open().await.unwrap(), 0, "nothing dead-lettered");
}

/// Writes `n` failure records (and their failed jobs) a day old, straight into the tables.
async fn old_records(backend: &SqliteBackend, n: u32) {
    let mut tx = backend.pool().begin().await.unwrap();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO redrive_jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap,
                                   status, created_at, attempts)
         SELECT 'old', 'old:n=' || i, '00000000-0000-0000-0000-000000000000', '{}', 'f', 'error', 1, 'failed', 0, 1
         FROM n",
    )
    .bind(n)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO redrive_failed_jobs (job_id, kind, idempotency_key, provider_key, payload, last_error, errors,
                                          attempts, cap, severity, first_failed_at, last_failed_at)
         SELECT id, kind, idempotency_key, provider_key, payload, 'gone', '[]', 1, 1, 'error', 0, 0
         FROM redrive_jobs WHERE kind = 'old'",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_keeps_completing_while_a_large_purge_runs() {
    const RECORDS: u32 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    // Commits that do not wait for the disk: what is measured is who holds the write lock.
    let config = SqliteConfig::new(dir.path().join("jobs.db")).with_synchronous(SqliteSynchronous::Normal);
    let backend = SqliteBackend::open(config.clone()).await.unwrap();
    old_records(&backend, RECORDS).await;
    backend.enqueue_batch((1..=20_000).map(ship).collect()).await.unwrap();
    // The operator's `redrive purge`: another connection to the file, as the CLI is another
    // process.
    let operator = SqliteBackend::open(config).await.unwrap();
    let config = WorkerConfig { concurrency: 4, ..WorkerConfig::default() };
    let worker = shipping_worker(&backend, dir.path().join("effects.log"), config);
    while worker.stats().succeeded < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let purge = tokio::spawn(async move { operator.purge(Duration::ZERO).await });
    // The longest time the worker completed nothing while the purge ran.
    let (mut last, mut since, mut longest) = (worker.stats().succeeded, Instant::now(), Duration::ZERO);
    while !purge.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = worker.stats().succeeded;
        if now > last {
            (last, since) = (now, Instant::now());
        }
        longest = longest.max(since.elapsed());
    }
    let purged = purge.await.unwrap().unwrap();
    let took = started.elapsed();
    let stats = worker.shutdown().await;
    assert_eq!(purged, u64::from(RECORDS));
    assert!(stats.succeeded < 20_000, "the queue outlasted the purge ({stats:?})");
    assert!(
        longest < Duration::from_secs(1),
        "the worker completed nothing for {longest:?} of the purge's {took:?}: the purge held the write lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_does_not_read_back_becomes_a_record_and_the_rest_run() {
    let (backend, dir) = common::backend().await;
    backend.enqueue_batch((1..=20).map(ship).collect()).await.unwrap();
    let (bad_payload, bad_provider_key) = (ship(7).key, ship(13).key);
    // Rows written by something else: a payload cut short, a provider key that is not a UUID.
    sqlx::query("UPDATE redrive_jobs SET payload = '{\"parcel\": 7' WHERE idempotency_key = ?1")
        .bind(bad_payload.as_str())
        .execute(backend.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE redrive_jobs SET provider_key = 'not a uuid' WHERE idempotency_key = ?1")
        .bind(bad_provider_key.as_str())
        .execute(backend.pool())
        .await
        .unwrap();
    let effects_file = dir.path().join("effects.log");
    let worker = shipping_worker(&backend, effects_file.clone(), WorkerConfig::default());
    let left = backend.wait_until_drained(Duration::from_secs(30)).await.unwrap();
    let stats = worker.shutdown().await;
    assert!(left.is_drained(), "one unreadable row stalls nothing: {left:?} ({stats:?})");
    let effects = effects(&effects_file);
    assert_eq!(effects.len(), 18, "every other job ran: {effects:?}");
    assert!(effects.values().all(|n| *n == 1));
    assert!(!effects.contains_key(bad_payload.as_str()) && !effects.contains_key(bad_provider_key.as_str()));

    let records = backend.list(&FailureQuery::open()).await.expect("a listing reads every record");
    let mut keys: Vec<_> = records.iter().map(|r| r.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, [bad_provider_key.clone(), bad_payload.clone()]);
    for record in &records {
        assert_eq!(record.attempts, 1, "no retries: reading it again cannot succeed");
        assert!(record.last_error.contains("does not read back"), "{}", record.last_error);
    }
    let cut_short = records.iter().find(|r| r.key == bad_payload).unwrap();
    assert_eq!(cut_short.payload, serde_json::json!("{\"parcel\": 7"), "the payload as stored, for a person to fix");
}
