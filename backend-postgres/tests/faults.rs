//! Faults with real processes and real connections: a worker killed mid-handler, connections
//! terminated under a running worker, racing transactional enqueues.

mod common;

use common::{Charge, charge, wait_for};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::kit::{Claim, Kinds, Renew};
use redrive_core::{
    Alert, AlertSink, DeadLetter, Enqueue, ErrorKind, FailureQuery, JobContext, JobError, RunningWorker, Worker,
    WorkerConfig,
};
use redrive_postgres::{EffectOnce, PgBackend, PgConfig};
use sqlx::Row;

async fn log_table(backend: &PgBackend) {
    let sql =
        format!("CREATE TABLE \"{}\".fault_log (key text, attempt int, pending bool, phase text)", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(backend.pool()).await.unwrap();
}

async fn log(backend: &PgBackend, ctx: &JobContext, phase: &str) {
    let sql = format!("INSERT INTO \"{}\".fault_log VALUES ($1, $2, $3, $4)", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(ctx.key.as_str())
        .bind(ctx.attempt as i32)
        .bind(ctx.earlier_attempt_pending)
        .bind(phase)
        .execute(backend.pool())
        .await
        .unwrap();
}

async fn logged(backend: &PgBackend, phase: &str) -> Vec<(String, i32, bool)> {
    let sql = format!("SELECT key, attempt, pending FROM \"{}\".fault_log WHERE phase = $1", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(phase)
        .fetch_all(backend.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn logging_worker(backend: &PgBackend, lease: Duration, hang: bool) -> RunningWorker {
    let config = WorkerConfig { lease, heartbeat: Some(lease / 3), ..WorkerConfig::default() };
    let logger = backend.clone();
    Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Charge>(move |_job: Charge, ctx: JobContext| {
            let logger = logger.clone();
            async move {
                log(&logger, &ctx, "started").await;
                if hang {
                    // The provider call that never returns: the process is killed here.
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                log(&logger, &ctx, "effect").await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

const KILL_TEST: &str = "a_worker_killed_mid_handler_runs_again_after_its_lease_once";

/// The same test binary plays the worker that gets killed: run with the child variable set, it
/// starts a worker whose handler hangs, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_handler_runs_again_after_its_lease_once() {
    if let Ok(schema) = std::env::var("REDRIVE_FAULT_CHILD_SCHEMA") {
        let config = PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(3);
        let backend = PgBackend::connect(config).await.unwrap();
        let _worker = logging_worker(&backend, Duration::from_secs(1), true);
        tokio::time::sleep(Duration::from_secs(600)).await;
        panic!("the child worker should have been killed");
    }
    let backend = common::backend("kill").await;
    log_table(&backend).await;
    backend.enqueue(charge(1)).await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([KILL_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("REDRIVE_FAULT_CHILD_SCHEMA", backend.schema())
        .env("DATABASE_URL", common::database_url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the child to start the handler", 60, async || !logged(&backend, "started").await.is_empty()).await;
    child.kill().unwrap(); // SIGKILL: no shutdown, no release, the lease is left to expire
    child.wait().unwrap();

    let worker = logging_worker(&backend, Duration::from_secs(5), false);
    wait_for("the job to run again", 30, async || !logged(&backend, "effect").await.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    worker.shutdown().await;
    let effects = logged(&backend, "effect").await;
    assert_eq!(effects.len(), 1, "one effect after the crash: {effects:?}");
    assert_eq!((effects[0].1, effects[0].2), (2, true), "attempt 2, told the first was left pending");
    assert_eq!(backend.count_open().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_during_claims_and_completions_lose_and_double_nothing() {
    let app = format!("redrive-fault-{}", std::process::id());
    let probe = common::backend("term").await;
    let config = PgConfig::new(common::database_url())
        .with_schema(probe.schema())
        .with_application_name(&app)
        .with_max_connections(4)
        .with_sweep_every(Duration::from_millis(200));
    let backend = PgBackend::connect(config).await.unwrap();
    const JOBS: u32 = 300;
    backend.enqueue_batch((0..JOBS).map(charge).collect()).await.unwrap();

    let (worker, effects) = common::counting_worker(&backend, Duration::from_millis(5));

    // Kill every connection of the worker's pool (and its LISTEN connection) again and again
    // while it claims and completes.
    let mut terminated = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let rows = sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_all(probe.pool())
            .await
            .unwrap();
        terminated += rows.len();
    }
    assert!(terminated > 0, "the test should have terminated connections");
    let pool = probe.pool().clone();
    let done_sql = format!("SELECT count(*) FROM \"{}\".jobs WHERE status = 'done'", probe.schema());
    wait_for("every job to be done", 60, async || {
        let n: i64 = sqlx::query(sqlx::AssertSqlSafe(done_sql.clone())).fetch_one(&pool).await.unwrap().get(0);
        n == i64::from(JOBS)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // past a lease: any lost settlement would rerun now
    worker.shutdown().await;
    let effects = effects.lock().unwrap().clone();
    let doubled: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert_eq!(effects.len() as u32, JOBS, "every job's effect happened");
    assert!(doubled.is_empty(), "effects repeated after {terminated} terminations: {doubled:?}");
    assert_eq!(probe.count_open().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_racing_transactional_enqueues_of_one_key_leave_one_job_if_any_commits() {
    let backend = common::backend("race").await;
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let mut tx = backend.pool().begin().await.unwrap();
                let result = backend.enqueue_in(&mut tx, charge(7)).await;
                tokio::time::sleep(Duration::from_millis(i * 7 % 20)).await;
                let commit = i % 3 != 0; // a third of the business transactions fail
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
                (commit, result.unwrap())
            })
        })
        .collect();
    let mut committed_created = Vec::new();
    for t in tasks {
        let (commit, result) = t.await.unwrap();
        if commit && result.is_created() {
            committed_created.push(result.id().clone());
        }
    }
    let sql = format!("SELECT id FROM \"{}\".jobs", backend.schema());
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(backend.pool()).await.unwrap();
    assert_eq!(rows.len(), 1, "exactly one job");
    assert_eq!(committed_created.len(), 1, "exactly one committed enqueue created it");
    assert_eq!(committed_created[0].0, rows[0].get::<i64, _>(0).to_string());

    // When every business transaction fails, no job exists.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let mut tx = backend.pool().begin().await.unwrap();
                backend.enqueue_in(&mut tx, charge(8)).await.unwrap();
                tx.rollback().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        backend
            .claim(&Kinds::Any, 10, Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap()
            .iter()
            .all(|c| c.job.key != charge(8).key)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_in_a_transaction_exists_only_if_it_commits() {
    let backend = common::backend("txn").await;
    let orders = format!("CREATE TABLE \"{}\".orders (id int PRIMARY KEY)", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(orders)).execute(backend.pool()).await.unwrap();
    let insert = format!("INSERT INTO \"{}\".orders VALUES ($1)", backend.schema());
    for (order, commit) in [(1, false), (2, true)] {
        let mut tx = backend.pool().begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(insert.clone())).bind(order as i32).execute(&mut *tx).await.unwrap();
        backend.enqueue_in(&mut tx, charge(order)).await.unwrap();
        if commit { tx.commit().await.unwrap() } else { tx.rollback().await.unwrap() }
    }
    backend.wake();
    let claimed = backend.claim(&Kinds::Any, 10, Duration::from_secs(5), Duration::from_secs(2)).await.unwrap();
    let keys: Vec<_> = claimed.iter().map(|c| c.job.key.clone()).collect();
    assert_eq!(keys, [charge(2).key], "only the committed order's job exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_commits_behind_the_claim_scan_is_still_claimed() {
    // Claims start scanning the ready index after their last full batch. A job enqueued in a long
    // transaction is ready from the transaction's start, so it commits behind that point.
    let backend = common::backend("floor").await;
    let mut tx = backend.pool().begin().await.unwrap();
    backend.enqueue_in(&mut tx, charge(0)).await.unwrap();
    backend.enqueue_batch((1..=20).map(charge).collect()).await.unwrap();
    let lease = Duration::from_secs(30);
    let first = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
    assert_eq!(first.len(), 10, "a full batch, taken while the late job is uncommitted");
    tx.commit().await.unwrap();

    let mut claimed: Vec<_> = first.iter().map(|c| c.job.key.clone()).collect();
    // The rest of the batch, then a claim that finds nothing past the floor and looks behind it.
    for _ in 0..2 {
        claimed.extend(
            backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap().into_iter().map(|c| c.job.key),
        );
    }
    let late = claimed.iter().filter(|k| **k == charge(0).key).count();
    assert_eq!(late, 1, "the late job is claimed once, without waiting for a poll");
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), 21, "every job claimed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_behind_the_claim_scan_wait_a_second_at_most_under_a_steady_backlog() {
    // Thirty jobs commit late, behind the scan floor, while a backlog keeps every claim full, so
    // no claim comes back short: the floor's one-second life is what brings them in.
    let backend = common::backend("floor_ttl").await;
    let mut tx = backend.pool().begin().await.unwrap();
    for order in 1000..1030 {
        backend.enqueue_in(&mut tx, charge(order)).await.unwrap();
    }
    backend.enqueue_batch((1..=300).map(charge).collect()).await.unwrap();
    let lease = Duration::from_secs(30);
    assert_eq!(backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap().len(), 10);
    tx.commit().await.unwrap();

    let committed = std::time::Instant::now();
    let (mut late, mut backlog) = (0, 10);
    while late < 30 {
        let claimed = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
        assert_eq!(claimed.len(), 10, "the backlog keeps claims full");
        for job in claimed {
            if job.job.payload["order"].as_u64().unwrap() >= 1000 { late += 1 } else { backlog += 1 }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(committed.elapsed() < Duration::from_secs(3), "took {:?}", committed.elapsed());
    assert!(backlog < 300, "the late jobs ran before the backlog was drained ({backlog} of 300 taken)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_database_effect_commits_once_with_its_key() {
    let backend = common::backend("effect").await;
    let credits = format!("CREATE TABLE \"{}\".credits (account text, amount int)", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(credits)).execute(backend.pool()).await.unwrap();
    let key = charge(9).key;
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let (backend, key) = (backend.clone(), key.clone());
            tokio::spawn(async move {
                let Some(mut tx) = backend.effect_tx(&key).await.unwrap() else { return false };
                let grant = format!("INSERT INTO \"{}\".credits VALUES ('acct', 100)", backend.schema());
                sqlx::query(sqlx::AssertSqlSafe(grant)).execute(&mut *tx).await.unwrap();
                if i == 0 {
                    tx.rollback().await.unwrap(); // a failed attempt: neither key nor effect stays
                    return false;
                }
                tx.commit().await.unwrap();
                true
            })
        })
        .collect();
    let mut applied = 0;
    for t in tasks {
        applied += t.await.unwrap() as usize;
    }
    let sql = format!("SELECT count(*) FROM \"{}\".credits", backend.schema());
    let rows: i64 = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(backend.pool()).await.unwrap().get(0);
    assert_eq!((applied, rows), (1, 1), "one grant, whatever the races and the rollback");
    let mut conn = backend.pool().acquire().await.unwrap();
    assert!(matches!(backend.effect_once(&mut conn, &key).await.unwrap(), EffectOnce::AlreadyApplied(_)));
}

struct CountAlerts(Arc<Mutex<usize>>);

impl AlertSink for CountAlerts {
    fn send<'a>(&'a self, _alert: &'a Alert) -> redrive_core::alert::BoxFuture<'a, redrive_core::Result<()>> {
        *self.0.lock().unwrap() += 1;
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_on_the_last_attempt_ends_as_a_failure_record_with_one_alert() {
    let backend = common::backend("lastcrash").await;
    backend.enqueue(charge(3).with_cap(1)).await.unwrap();
    let crashed = backend.claim(&Kinds::Any, 1, Duration::from_millis(300), Duration::from_secs(5)).await.unwrap();
    assert_eq!(crashed.len(), 1);
    // Its handler starts (the lease is renewed, marking the attempt started), then the worker
    // dies on the only attempt. An attempt that never started would be given back instead.
    backend.renew(&crashed[0].lease, Duration::from_millis(300)).await.unwrap();
    drop(crashed);
    let alerts = Arc::new(Mutex::new(0));
    let ran = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&ran);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .handle::<Charge>(move |_job: Charge, _ctx: JobContext| {
            let counter = Arc::clone(&counter);
            async move {
                *counter.lock().unwrap() += 1;
                Ok::<_, JobError>(())
            }
        })
        .alert(CountAlerts(Arc::clone(&alerts)))
        .build()
        .start();
    wait_for("the failure record", 30, async || backend.count_open().await.unwrap() == 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.shutdown().await;
    let record = backend.list(&FailureQuery::open()).await.unwrap().remove(0);
    assert_eq!((record.attempts, record.cap), (2, 1));
    assert!(record.last_error.contains("past the cap"), "{}", record.last_error);
    assert_eq!(*ran.lock().unwrap(), 0, "no attempt was left to run the handler");
    assert_eq!(*alerts.lock().unwrap(), 1);
}

#[tokio::test]
async fn invalid_schema_names_are_refused_before_connecting() {
    for bad in ["Jobs", "a-b", "x\"; drop table y; --", "pg_toast"] {
        let err =
            PgBackend::connect(PgConfig::new("postgres://nowhere.invalid/db").with_schema(bad)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{bad}");
    }
}
