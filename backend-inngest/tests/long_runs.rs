//! Runs longer than Inngest's steps allow (1,000 a run; 20 here, on both sides): a job deferred
//! through a long pause, and one retried past a run's room, each continue as a new run of the
//! same job, carrying its attempts and errors. Without the continuation the emulator fails the
//! run at its limit, and the failure handler makes it a record: these tests would fail.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{
    Backoff, DeadLetter, Enqueue, FailureQuery, Flow, Job, JobContext, JobError, KeyBuilder, NewJob, Worker,
};
use redrive_inngest_emulator::RunStatus;
use serde::{Deserialize, Serialize};

const STEPS: usize = 20;

#[derive(Serialize, Deserialize)]
struct Export {
    report: u32,
}

impl Job for Export {
    const KIND: &'static str = "export";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("report", self.report)
    }
}

/// A call no worker claims goes back after 100 ms (a step each time), rather than 20 s.
async fn rig() -> common::Rig {
    let config =
        |c: redrive_inngest::InngestConfig| c.with_max_steps(STEPS).with_park_limit(Duration::from_millis(100));
    common::rig_with(common::emulator().max_steps(STEPS), config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deferred_through_a_long_pause_continues_and_runs_once_on_its_first_attempt() {
    let rig = rig().await;
    let flow = rig.ledger.flow().expect("PostgreSQL keeps a flow store");
    assert!(flow.pause(Export::KIND, "the warehouse is down", "ana", None).await.unwrap());
    for report in [1, 2] {
        rig.backend.enqueue(NewJob::from_job(&Export { report }).unwrap()).await.unwrap();
    }
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    // The worker starts while its kind is paused: it claims none of its calls, each goes back
    // after the park limit (a mark, a step), and no round counts towards "handled nowhere".
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Export>(move |job: Export, ctx: JobContext| {
            seen.lock().unwrap().push((job.report, ctx.attempt));
            async { Ok::<_, JobError>(()) }
        })
        .poll(Duration::from_millis(20))
        .build()
        .start();
    // Each job's run takes nine rounds, then continues: three runs a job at least.
    let continued = rig
        .emulator
        .wait_for_runs(Duration::from_secs(60), |runs| {
            runs.iter().filter(|r| r.function_id.ends_with("-jobs")).count() >= 6
        })
        .await;
    assert!(continued.is_ok(), "runs: {:#?}", rig.emulator.runs());
    assert!(attempts.lock().unwrap().is_empty(), "nothing ran while the kind was paused");
    assert!(flow.resume(Export::KIND, "bo").await.unwrap());
    let done = rig
        .emulator
        .wait_for_runs(Duration::from_secs(30), |runs| {
            runs.iter()
                .filter(|r| r.status == RunStatus::Completed && r.output.as_ref().is_some_and(|o| o.is_null()))
                .count()
                >= 2
        })
        .await;
    assert!(done.is_ok(), "runs: {:#?}", rig.emulator.runs());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = worker.shutdown().await;

    let mut ran = attempts.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, [(1, 1), (2, 1)], "each job ran once, on attempt 1: {stats:?}");
    let runs = rig.emulator.runs();
    assert!(runs.iter().all(|r| r.status != RunStatus::Failed), "no run reached the limit: {runs:#?}");
    assert!(runs.iter().all(|r| !r.function_id.ends_with("-failure")), "{runs:#?}");
    let records = rig.backend.list(&FailureQuery::open()).await.unwrap();
    assert!(records.is_empty(), "a pause leaves no record: {records:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_retried_past_a_run_s_room_keeps_its_attempts_and_errors_in_its_record() {
    let rig = rig().await;
    let tries = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&tries);
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Export>(move |_job: Export, ctx: JobContext| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { Err::<(), _>(JobError::retry(format!("the warehouse refused attempt {}", ctx.attempt))) }
        })
        .poll(Duration::from_millis(20))
        .backoff(Backoff { base: Duration::from_millis(10), max: Duration::from_millis(40), ..Backoff::default() })
        .build()
        .start();
    // A cap of 12: 11 retries, 22 steps, past a run's 20.
    let enqueued = rig.backend.enqueue(NewJob::from_job(&Export { report: 7 }).unwrap().with_cap(12)).await.unwrap();
    let redrive_core::Enqueued::Created(job_id) = enqueued else { panic!("{enqueued:?}") };
    let mut records = Vec::new();
    for _ in 0..300 {
        records = rig.backend.list(&FailureQuery::open()).await.unwrap();
        if !records.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    assert_eq!(records.len(), 1, "one record: {records:#?}");
    let record = &records[0];
    assert_eq!((record.attempts, record.cap, tries.load(Ordering::SeqCst)), (12, 12, 12), "{record:#?}");
    assert_eq!(record.job_id, job_id, "the job keeps the id enqueue gave it, whichever run it ends in");
    let history: Vec<u32> = record.errors.iter().map(|e| e.attempt).collect();
    // The first error and the latest five, as every record keeps them: attempt 1 failed in the
    // first run, the latest in the last.
    assert_eq!(history, [1, 8, 9, 10, 11, 12], "the errors, across the runs: {record:#?}");
    assert!(record.last_error.contains("attempt 12"), "{record:#?}");
    let runs = rig.emulator.runs();
    let jobs: Vec<_> = runs.iter().filter(|r| r.function_id.ends_with("-jobs")).collect();
    assert!(jobs.len() >= 2, "the run continued: {runs:#?}");
    // The last run fails (the worker's dead letter); the ones before it completed.
    assert_eq!(jobs.iter().filter(|r| r.status == RunStatus::Failed).count(), 1, "{runs:#?}");
}
