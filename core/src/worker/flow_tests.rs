//! The circuit breaker's edges, on the in-memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::*;
use crate::backend::{BREAKER, DeadLetter, EnqueueExt, Flow};
use crate::job::{JobContext, JobError};
use crate::key::KeyBuilder;
use crate::memory::MemoryBackend;

#[derive(Serialize, Deserialize)]
struct Charge {
    n: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    const CAP: Option<u32> = Some(1);
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

fn config() -> WorkerConfig {
    WorkerConfig { backoff: Backoff::NONE, poll: Duration::from_millis(50), ..WorkerConfig::default() }
}

async fn paused_by_breaker(backend: &MemoryBackend) -> bool {
    let kinds = backend.kinds().await.unwrap();
    kinds.iter().any(|k| k.kind == Charge::KIND && k.paused.as_ref().is_some_and(|p| p.by == BREAKER))
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_old_to_wait_for_free_still_waits_out_its_breakers_pause_at_no_cost() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Charge { n: 1 }).await.unwrap();
    // Every job is too old for a "not now" at no cost, and has one attempt: a failure that
    // became an ordinary retry would be its record.
    let config = WorkerConfig { max_not_now: Duration::ZERO, ..config() };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Charge>(|_job: Charge, _ctx: JobContext| async { Err::<(), _>(JobError::retry("503")) })
        .breaker::<Charge>(Breaker { after: 1, cool_down: Duration::from_secs(60) })
        .build()
        .start();
    until("the breaker's pause", async || paused_by_breaker(&backend).await).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats = worker.shutdown().await;
    assert_eq!(backend.count_open().await.unwrap(), 0, "the failure that tripped the breaker is not the job's");
    assert_eq!((stats.retried, stats.dead_lettered, stats.deferred), (0, 0, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_resume_a_new_run_of_failures_is_needed_to_trip_again() {
    let backend = MemoryBackend::new();
    let failing = Arc::new(AtomicBool::new(true));
    let fails = Arc::clone(&failing);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config())
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            let fails = fails.load(Ordering::SeqCst) || job.n == 3;
            async move { if fails { Err(JobError::retry("503")) } else { Ok(()) } }
        })
        .breaker::<Charge>(Breaker { after: 2, cool_down: Duration::from_secs(60) })
        .build()
        .start();
    for n in [1, 2] {
        backend.enqueue_job(&Charge { n }).await.unwrap();
    }
    until("the breaker's pause", async || paused_by_breaker(&backend).await).await;
    failing.store(false, Ordering::SeqCst);
    assert!(backend.resume(Charge::KIND, "ana").await.unwrap());
    // A poll for the worker to see the resume, then one failure: one in a row, not three.
    tokio::time::sleep(Duration::from_millis(150)).await;
    backend.enqueue_job(&Charge { n: 3 }).await.unwrap();
    until("the third job's failure", async || worker.stats().deferred + worker.stats().dead_lettered >= 3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker.shutdown().await;
    assert!(!paused_by_breaker(&backend).await, "one failure after a resume tripped the breaker again");
    let pauses = backend.events(Some(Charge::KIND), 10).await.unwrap();
    assert_eq!(pauses.iter().filter(|e| e.action == crate::FlowAction::Paused).count(), 1);
}
