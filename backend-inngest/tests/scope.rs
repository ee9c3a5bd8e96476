//! Two apps on one Inngest account and one database (two services, or staging beside
//! production) with the same job keys: each runs its own jobs, and a failed run's record is kept
//! and listed by its own app only.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::{DeadLetter, Enqueue, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn worker(rig: &common::Rig, fails: bool, runs: &Arc<AtomicU32>) -> redrive_core::RunningWorker {
    let runs = Arc::clone(runs);
    Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Ship>(move |_job: Ship, _ctx: JobContext| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move { if fails { Err(JobError::permanent("the carrier refused it")) } else { Ok(()) } }
        })
        .build()
        .start()
}

#[tokio::test]
async fn two_apps_on_one_account_run_and_record_only_their_own() {
    let staging = common::rig().await;
    // The same account and the same database: only the app tells them apart.
    let production = common::rig_beside(&staging).await;
    let (staging_runs, production_runs) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (a, b) = (worker(&staging, true, &staging_runs), worker(&production, false, &production_runs));
    let job = NewJob::from_job(&Ship { parcel: 3 }).unwrap();
    staging.backend.enqueue(job.clone()).await.unwrap();
    production.backend.enqueue(job.clone()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while staging.backend.count_open().await.unwrap() == 0 || production_runs.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "both apps' jobs should have run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((staging_runs.load(Ordering::SeqCst), production_runs.load(Ordering::SeqCst)), (1, 1));
    let records = staging.backend.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key, job.key);
    assert!(production.backend.list(&FailureQuery::open()).await.unwrap().is_empty(), "the failure is staging's");
    a.shutdown().await;
    b.shutdown().await;
}
