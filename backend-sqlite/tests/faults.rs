//! Faults with a real file and real processes: a worker process killed mid-batch and restarted,
//! a file that is not a database, a database locked by another connection, a full disk.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{
    Enqueue, ErrorKind, IdempotencyKey, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats, QueueStatsExt,
    Retry, RunningWorker, Worker, WorkerConfig,
};
use redrive_sqlite::sqlx::{self, Row};
use redrive_sqlite::{EffectOnce, SqliteBackend, SqliteConfig};

const JOBS: u32 = 300;

/// A credit to an account: one per account, whatever happens to the worker.
#[derive(serde::Serialize, serde::Deserialize)]
struct Credit {
    account: u32,
}

impl Job for Credit {
    const KIND: &'static str = "credit";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", self.account)
    }
}

fn job(n: u32) -> NewJob {
    NewJob::from_job(&Credit { account: n }).unwrap()
}

/// The application's own table in the same file: one row per credit given. No unique
/// constraint, so a credit given twice would show.
async fn effects_table(backend: &SqliteBackend) {
    sqlx::query("CREATE TABLE IF NOT EXISTS credits (key TEXT NOT NULL, pid INTEGER NOT NULL)")
        .execute(backend.pool())
        .await
        .unwrap();
}

/// A worker whose handler gives the credit and takes its key in one transaction of the same file.
fn crediting_worker(backend: &SqliteBackend) -> RunningWorker {
    let app = backend.clone();
    let config = WorkerConfig { concurrency: 8, lease: Duration::from_secs(2), ..WorkerConfig::default() };
    Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Credit>(move |_credit: Credit, ctx: JobContext| {
            let app = app.clone();
            async move {
                let mut tx = app.pool().begin_with("BEGIN IMMEDIATE").await.map_err(JobError::retry)?;
                if app.effect_once(&mut tx, &ctx.key).await.map_err(JobError::retry)? == EffectOnce::Fresh {
                    sqlx::query("INSERT INTO credits (key, pid) VALUES (?1, ?2)")
                        .bind(ctx.key.as_str())
                        .bind(i64::from(std::process::id()))
                        .execute(&mut *tx)
                        .await
                        .map_err(JobError::retry)?;
                }
                tx.commit().await.map_err(JobError::retry)?;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

async fn credits(backend: &SqliteBackend) -> (i64, i64) {
    let row = sqlx::query("SELECT count(*), count(DISTINCT key) FROM credits").fetch_one(backend.pool()).await.unwrap();
    (row.get(0), row.get(1))
}

const KILL_TEST: &str = "a_worker_process_killed_mid_batch_and_restarted_does_every_job_once";

/// The same test binary plays the worker that gets killed: run with the child variable set, it
/// works the queue until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_batch_and_restarted_does_every_job_once() {
    if let Ok(path) = std::env::var("REDRIVE_SQLITE_CHILD_DB") {
        let backend = SqliteBackend::open(SqliteConfig::new(path)).await.unwrap();
        let _worker = crediting_worker(&backend);
        tokio::time::sleep(Duration::from_secs(600)).await;
        panic!("the child worker should have been killed");
    }
    let (backend, dir) = common::backend().await;
    effects_table(&backend).await;
    backend.enqueue_batch((1..=JOBS).map(job).collect()).await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([KILL_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("REDRIVE_SQLITE_CHILD_DB", dir.path().join("jobs.db"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while credits(&backend).await.0 < i64::from(JOBS / 4) {
        assert!(started.elapsed() < Duration::from_secs(60), "the child worker gives no credit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap(); // SIGKILL mid-batch: claimed jobs, leases and transactions left behind
    child.wait().unwrap();
    let (given, _) = credits(&backend).await;
    assert!(given < i64::from(JOBS), "killed before the end ({given} given)");

    // Restarted: the rest, once each.
    let worker = crediting_worker(&backend);
    let left = backend.wait_until_drained(Duration::from_secs(60)).await.unwrap();
    worker.shutdown().await;
    assert!(left.is_drained(), "every job done: {left:?}");
    assert_eq!(credits(&backend).await, (i64::from(JOBS), i64::from(JOBS)), "every credit given once");
    assert_eq!(redrive_core::DeadLetter::count_open(&backend).await.unwrap(), 0, "nothing dead-lettered");
    let integrity: String = sqlx::query("PRAGMA integrity_check").fetch_one(backend.pool()).await.unwrap().get(0);
    assert_eq!(integrity, "ok");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_clear_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    std::fs::write(&path, b"these are not the pages you are looking for, not even one of them. ".repeat(100)).unwrap();
    let err = SqliteBackend::open(SqliteConfig::new(&path)).await.unwrap_err();
    assert_eq!((err.kind(), err.retry()), (ErrorKind::Backend, Retry::Permanent), "{err}");
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert!(std::fs::read(&path).unwrap().starts_with(b"these are not"), "the file is left as it was");
}

#[tokio::test]
async fn a_database_locked_by_another_process_is_a_temporary_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let config = SqliteConfig::new(&path).with_busy_timeout(Duration::from_millis(300));
    let backend = SqliteBackend::open(config.clone()).await.unwrap();
    backend.enqueue(job(1)).await.unwrap();

    // Another program takes the write lock and keeps it.
    use sqlx::Connection;
    let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut other).await.unwrap();
    let started = std::time::Instant::now();
    let err = backend.enqueue(job(2)).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited out the busy timeout first");
    assert_eq!((err.kind(), err.retry()), (ErrorKind::Backend, Retry::Temporary), "{err}");
    assert!(err.to_string().contains("locked"), "{err}");
    assert_eq!(backend.counts().await.unwrap().queued, 1, "readers still read");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();

    // Once it lets go, the same enqueue goes through, and nothing committed was lost.
    backend.enqueue(job(2)).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(claimed.len(), 2);
}

#[tokio::test]
async fn a_full_disk_is_a_typed_error_and_loses_nothing_committed() {
    let (backend, _dir) = common::backend().await;
    // A size-limited file: the one writer connection may grow it to 64 pages of 4 KiB.
    sqlx::query("PRAGMA max_page_count = 64").execute(backend.pool()).await.unwrap();
    let mut kept = 0;
    let err = loop {
        let key = IdempotencyKey::builder("blob").fact("n", kept).build().unwrap();
        let job = NewJob::new("blob", key, serde_json::Value::String("x".repeat(20_000))).unwrap();
        match backend.enqueue(job).await {
            Ok(_) => kept += 1,
            Err(e) => break e,
        }
        assert!(kept < 1000, "the size limit never bit");
    };
    assert_eq!((err.kind(), err.retry()), (ErrorKind::Backend, Retry::Temporary), "{err}");
    assert!(err.to_string().contains("full"), "{err}");
    assert!(kept > 0);
    assert_eq!(backend.counts().await.unwrap().queued, kept as u64, "every enqueue that succeeded is there");
    let integrity: String = sqlx::query("PRAGMA integrity_check").fetch_one(backend.pool()).await.unwrap().get(0);
    assert_eq!(integrity, "ok");
}

#[tokio::test]
async fn a_database_another_process_holds_locked_is_a_clear_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    // Another program's database in rollback-journal mode, its exclusive lock held: not even
    // readers get in.
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE app (x INTEGER)").execute(&mut other).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut other).await.unwrap();
    sqlx::query("INSERT INTO app VALUES (1)").execute(&mut other).await.unwrap();

    let config = SqliteConfig::new(&path).with_busy_timeout(Duration::from_millis(300));
    let err = SqliteBackend::open(config.clone()).await.unwrap_err();
    assert_eq!((err.kind(), err.retry()), (ErrorKind::Backend, Retry::Temporary), "{err}");
    assert!(err.to_string().contains("locked"), "{err}");

    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    drop(other);
    let backend = SqliteBackend::open(config).await.expect("opens once the lock is gone");
    backend.enqueue(job(1)).await.unwrap();
    let row = sqlx::query("SELECT count(*) FROM app").fetch_one(backend.pool()).await.unwrap();
    assert_eq!(row.get::<i64, _>(0), 1, "the other program's table is untouched");
}

#[tokio::test]
async fn an_in_memory_database_works_the_queue_and_keeps_nothing() {
    let backend = SqliteBackend::open(SqliteConfig::memory()).await.unwrap();
    backend.enqueue(job(1)).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(claimed.len(), 1);
    backend.complete(&claimed[0].lease, None).await.unwrap();
    assert!(backend.counts().await.unwrap().is_drained());
    let fresh = SqliteBackend::open(SqliteConfig::memory()).await.unwrap();
    assert!(fresh.enqueue(job(1)).await.unwrap().is_created(), "another in-memory database is empty");
}
