//! A worker process killed with SIGKILL in the middle of its jobs, on moto's SQS with the
//! effect ledger and records in PostgreSQL: a second worker finishes every job, each once.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use redrive_core::{DeadLetter, Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, RunningWorker, Worker};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    order: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

const JOBS: u32 = 20;
const KILL_TEST: &str = "a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once";

/// Appends `phase order attempt pending` to the log file both processes share.
fn log(path: &str, phase: &str, job: &Charge, ctx: &JobContext) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    writeln!(file, "{phase} {} {} {}", job.order, ctx.attempt, ctx.earlier_attempt_pending).unwrap();
}

/// The log's lines of `phase`: (order, attempt, earlier attempt pending).
fn logged(path: &str, phase: &str) -> Vec<(u32, u32, bool)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            (f.next() == Some(phase)).then(|| {
                let mut n = || f.next().unwrap().to_owned();
                (n().parse().unwrap(), n().parse().unwrap(), n() == "true")
            })
        })
        .collect()
}

/// A worker whose handler logs its start and, unless `hang`, its effect; hanging, it never
/// returns (the process is killed there).
fn worker(queue: &SqsBackend, ledger: &PgBackend, path: &str, hang: bool) -> RunningWorker {
    let config = redrive_core::WorkerConfig {
        concurrency: 4,
        lease: Duration::from_secs(2),
        heartbeat: Some(Duration::from_millis(700)),
        ..redrive_core::WorkerConfig::default()
    };
    let path = path.to_owned();
    Worker::builder(queue.clone(), ledger.clone())
        .config(config)
        .handle::<Charge>(move |job: Charge, ctx: JobContext| {
            let path = path.clone();
            async move {
                log(&path, "started", &job, &ctx);
                if hang {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                log(&path, "effect", &job, &ctx);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

async fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The same test binary plays the worker that is killed: run with the child variables set, it
/// starts a worker whose handlers hang, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once() {
    if let (Ok(queue), Ok(schema), Ok(path)) =
        (std::env::var("REDRIVE_KILL_QUEUE"), std::env::var("REDRIVE_KILL_SCHEMA"), std::env::var("REDRIVE_KILL_LOG"))
    {
        let store = PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(3);
        let store = PgBackend::connect(store).await.unwrap();
        let queue = common::queue_named(&queue, QueueSetup::default(), store.clone()).await;
        let _worker = worker(&queue, &store, &path, true);
        tokio::time::sleep(Duration::from_secs(600)).await;
        panic!("the child worker should have been killed");
    }
    let name = common::name("kill");
    let ledger = common::ledger().await;
    let queue = common::queue_named(&name, QueueSetup::default(), ledger.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("effects.log").to_string_lossy().into_owned();
    let jobs: Vec<NewJob> = (0..JOBS).map(|order| NewJob::from_job(&Charge { order }).unwrap()).collect();
    queue.enqueue_batch(jobs).await.unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([KILL_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("REDRIVE_KILL_QUEUE", &name)
        .env("REDRIVE_KILL_SCHEMA", ledger.schema())
        .env("REDRIVE_KILL_LOG", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the child to start four handlers", 60, || logged(&path, "started").len() >= 4).await;
    child.kill().unwrap(); // SIGKILL: no shutdown, no release, no delete; the visibility lapses
    child.wait().unwrap();
    let killed_mid_job: Vec<u32> = logged(&path, "started").iter().map(|s| s.0).collect();
    assert!(logged(&path, "effect").is_empty(), "the child's handlers all hang");

    let worker = worker(&queue, &ledger, &path, false);
    wait_for("every job's effect", 60, || logged(&path, "effect").len() >= JOBS as usize).await;
    // Past a lease and a visibility: a job left to run again would show now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    worker.shutdown().await;
    let effects = logged(&path, "effect");
    let mut orders: Vec<u32> = effects.iter().map(|e| e.0).collect();
    orders.sort_unstable();
    assert_eq!(orders, (0..JOBS).collect::<Vec<_>>(), "every job's effect once: {effects:?}");
    for (order, attempt, pending) in effects.iter().filter(|e| killed_mid_job.contains(&e.0)) {
        assert!(
            *pending && *attempt >= 2,
            "order {order} was started by the killed worker: attempt {attempt} told so ({pending})"
        );
    }
    assert_eq!(queue.count_open().await.unwrap(), 0, "no failure record");
}
