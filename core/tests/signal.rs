//! `run_until_signal`: SIGTERM to the process lets the running handler finish and stops the
//! worker. A file of its own: the signal goes to the whole test process.

#![cfg(unix)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::{EnqueueExt, Job, JobContext, JobError, KeyBuilder, MemoryBackend, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Slow {
    n: u32,
}

impl Job for Slow {
    const KIND: &'static str = "slow";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_handler_finish_and_stops_the_worker() {
    let backend = MemoryBackend::new();
    backend.enqueue_job(&Slow { n: 1 }).await.unwrap();
    let (started, finished) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (s, f) = (Arc::clone(&started), Arc::clone(&finished));
    let worker = Worker::builder(backend.clone(), backend.clone())
        .handle::<Slow>(move |_job: Slow, _ctx: JobContext| {
            let (s, f) = (Arc::clone(&s), Arc::clone(&f));
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(800)).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    while started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = tokio::spawn(worker.run_until_signal());
    // Let it listen before the signal comes (the default action would end the test process).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stopped.is_finished(), "the worker runs until a signal");
    let kill = std::process::Command::new("kill").args(["-TERM", &std::process::id().to_string()]).status();
    assert!(kill.unwrap().success());
    let stats = tokio::time::timeout(Duration::from_secs(10), stopped).await.expect("stops").unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), 1, "the running handler finished first");
    assert_eq!((stats.succeeded, stats.released), (1, 0));
}
