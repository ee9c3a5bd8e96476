//! A worker process killed with SIGKILL in the middle of its jobs, on Azurite with the
//! effect ledger and records in PostgreSQL: a second worker finishes every job, each once
//! ([`redrive_conformance::kill_worker_mid_job`]).

mod common;

use redrive_azure::QueueOptions;
use redrive_conformance::EnqueueJobs;
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
        let queue = common::queue_named(&queue, QueueOptions::default(), store.clone()).await;
        redrive_conformance::hang_until_killed(queue, store).await;
    }
    let name = common::name("kill");
    let ledger = common::store().await;
    let queue = common::queue_named(&name, QueueOptions::default(), ledger.clone()).await;
    let env = [("REDRIVE_KILL_QUEUE", name.clone()), ("REDRIVE_KILL_SCHEMA", ledger.schema().to_owned())];
    let test = "a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once";
    redrive_conformance::kill_worker_mid_job(test, &env, EnqueueJobs::BeforeChild, &queue, &ledger, async {}).await;
}
