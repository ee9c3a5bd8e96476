//! A worker **process** killed with SIGKILL in the middle of its jobs: no shutdown, no release,
//! no settle. The in-process scenarios cannot do this (their workers die politely or freeze), so
//! this one runs as a test of your own that re-runs its own binary as the worker to kill.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{Job, JobContext, JobError, KeyBuilder, NewJob, RunningWorker, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};

use crate::Queue;

/// The variable that tells the re-run test binary it is the child, and where its log is.
const LOG_VAR: &str = "REDRIVE_KILL_LOG";
const JOBS: u32 = 20;
const CONCURRENCY: usize = 4;

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

/// Whether this process is the child [`kill_worker_mid_job`] started: then connect to the
/// queue and ledger it names in its variables and call [`hang_until_killed`].
pub fn is_killed_child() -> bool {
    std::env::var_os(LOG_VAR).is_some()
}

/// The child's side: starts a worker whose handlers hang once started, tells the parent it is
/// ready, and waits to be killed. Panics if it is not.
pub async fn hang_until_killed<Q: Queue, L: Ledger + Clone + 'static>(queue: Q, ledger: L) -> ! {
    let log = PathBuf::from(std::env::var_os(LOG_VAR).expect("started by kill_worker_mid_job"));
    let _worker = worker(&queue, &ledger, &log, true);
    append(&log, "ready");
    tokio::time::sleep(Duration::from_secs(600)).await;
    panic!("the child worker should have been killed");
}

/// When [`kill_worker_mid_job`] enqueues its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueJobs {
    /// Before the child starts: a queue the worker pulls from keeps them.
    BeforeChild,
    /// Once the child's worker runs: a queue that pushes to a receiver delivers at once, and
    /// needs the child listening.
    OnceChildRuns,
}

/// The parent's side. Re-runs this test binary with only `test` (which must start with
/// [`is_killed_child`]) and `env` as the child's worker, enqueues twenty jobs (`when`), and
/// kills it (SIGKILL) once it has started four. Then, after `after_kill` (say, to listen
/// where the child did), a second worker in this process on `queue` and `ledger` must finish
/// every job, each effect once, those the killed worker started told that an earlier attempt
/// is pending, and leave no failure record. Panics on any violation.
///
/// Write one `#[tokio::test(flavor = "multi_thread")]` that starts with the child's side and goes
/// on with the parent's (the queue and ledger must be shared between processes: a broker and
/// a database, not the memory backend):
///
/// ```no_run
/// # use redrive_core::MemoryBackend;
/// # async fn connect(_queue_name: &str) -> (MemoryBackend, MemoryBackend) { unimplemented!() }
/// #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// async fn killed_worker() {
///     if redrive_conformance::is_killed_child() {
///         // The child: reconnect to what the parent made, then hang until killed.
///         let name = std::env::var("MY_QUEUE").unwrap();
///         let (queue, ledger) = connect(&name).await;
///         redrive_conformance::hang_until_killed(queue, ledger).await;
///     }
///     let (queue, ledger) = connect("kill-test").await;
///     let env = [("MY_QUEUE", "kill-test".to_owned())];
///     let when = redrive_conformance::EnqueueJobs::BeforeChild;
///     redrive_conformance::kill_worker_mid_job("killed_worker", &env, when, &queue, &ledger, async {}).await;
/// }
/// ```
pub async fn kill_worker_mid_job<Q: Queue, L: Ledger + Clone + 'static>(
    test: &str,
    env: &[(&str, String)],
    when: EnqueueJobs,
    queue: &Q,
    ledger: &L,
    after_kill: impl Future<Output = ()>,
) {
    let log = LogFile::new();
    let jobs = || (0..JOBS).map(|order| NewJob::from_job(&Charge { order }).unwrap()).collect::<Vec<_>>();
    if when == EnqueueJobs::BeforeChild {
        queue.enqueue_batch(jobs()).await.unwrap();
    }
    let path = log.0.as_path();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(LOG_VAR, path);
    for (name, value) in env {
        child.env(name, value);
    }
    let mut child = child.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the child's worker", 60, || std::fs::read_to_string(path).is_ok_and(|t| t.contains("ready"))).await;
    if when == EnqueueJobs::OnceChildRuns {
        queue.enqueue_batch(jobs()).await.unwrap();
    }
    wait_for("the child to start four handlers", 60, || logged(path, "started").len() >= CONCURRENCY).await;
    child.kill().unwrap(); // SIGKILL: no shutdown, no release, no delete; the lease lapses
    child.wait().unwrap();
    let killed_mid_job: Vec<u32> = logged(path, "started").iter().map(|s| s.0).collect();
    assert!(logged(path, "effect").is_empty(), "the child's handlers all hang");
    after_kill.await;

    let worker = worker(queue, ledger, path, false);
    wait_for("every job's effect", 60, || logged(path, "effect").len() >= JOBS as usize).await;
    // Past a lease and a visibility: a job left to run again would show now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    worker.shutdown().await;
    let effects = logged(path, "effect");
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

/// A worker whose handler logs its start and, unless `hang`, its effect; hanging, it never
/// returns (the process is killed there).
fn worker<Q: Queue, L: Ledger + Clone + 'static>(queue: &Q, ledger: &L, log: &Path, hang: bool) -> RunningWorker {
    let config = WorkerConfig {
        concurrency: CONCURRENCY,
        lease: Duration::from_secs(2),
        heartbeat: Some(Duration::from_millis(700)),
        ..WorkerConfig::default()
    };
    let log = log.to_owned();
    Worker::builder(queue.clone(), ledger.clone())
        .config(config)
        .handle::<Charge>(move |job: Charge, ctx: JobContext| {
            let log = log.clone();
            async move {
                let line = |phase| format!("{phase} {} {} {}", job.order, ctx.attempt, ctx.earlier_attempt_pending);
                append(&log, &line("started"));
                if hang {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                append(&log, &line("effect"));
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

/// The log both processes append to: `ready`, and `phase order attempt pending` lines.
struct LogFile(PathBuf);

impl LogFile {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        Self(std::env::temp_dir().join(format!("redrive-kill-{}-{nanos}.log", std::process::id())))
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Appends `line` in one write, so that lines from concurrent handlers never interleave.
fn append(log: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// The log's lines of `phase`: (order, attempt, earlier attempt pending).
fn logged(log: &Path, phase: &str) -> Vec<(u32, u32, bool)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
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

async fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
