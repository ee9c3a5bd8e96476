//! A worker process killed with SIGKILL in the middle of its jobs, on pgmq: a second worker
//! finishes every job, each once ([`redrive_conformance::kill_worker_mid_job`]), once the killed
//! reads' visibility lapses.

mod common;

use redrive_conformance::EnqueueJobs;
use redrive_pgmq::{PgmqBackend, PgmqConfig};
use redrive_postgres::{PgBackend, PgConfig};

/// The same test binary plays the worker that is killed: run with the child variables set, it
/// reconnects to the parent's queue and schema and hangs in its handlers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once() {
    if redrive_conformance::is_killed_child() {
        let (Ok(queue), Ok(schema)) = (std::env::var("REDRIVE_KILL_QUEUE"), std::env::var("REDRIVE_KILL_SCHEMA"))
        else {
            panic!("the parent names the queue and schema");
        };
        let store = PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(3);
        let store = PgBackend::connect(store).await.unwrap();
        let queue = PgmqBackend::connect(PgmqConfig::new(queue), store.clone()).await.unwrap();
        redrive_conformance::hang_until_killed(queue, store).await;
    }
    let (queue, ledger) = common::queue("kill").await;
    let env =
        [("REDRIVE_KILL_QUEUE", queue.queue_name().to_owned()), ("REDRIVE_KILL_SCHEMA", ledger.schema().to_owned())];
    let test = "a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once";
    redrive_conformance::kill_worker_mid_job(test, &env, EnqueueJobs::BeforeChild, &queue, &ledger, async {}).await;
}
