//! A receiver whose clock is minutes off QStash's: it checks each signature's `nbf` and `exp`
//! against its own clock, so it refuses every delivery. Nothing runs while it is off; a job is
//! not lost while QStash retries remain, and past them it is a failure record, never run.

mod common;

use common::Grant;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use redrive_core::{DeadLetter, Enqueue, NewJob};
use redrive_qstash::Clock;

/// A rig whose receiver's clock is `skew` seconds off (changed as the test goes).
async fn skewed(skew: &Arc<AtomicI64>) -> common::Rig {
    let offset = Arc::clone(skew);
    let clock: Clock = Arc::new(move || chrono::Utc::now() + chrono::Duration::seconds(offset.load(Ordering::SeqCst)));
    common::rig_with(common::emulator(), |c| c.with_clock(clock)).await
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn refusals(rig: &common::Rig) -> usize {
    rig.emulator.deliveries().iter().filter(|d| d.status == Some(401)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_ten_minutes_behind_runs_nothing_and_once_set_right_runs_the_job_once() {
    let skew = Arc::new(AtomicI64::new(-600));
    let rig = skewed(&skew).await;
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    rig.backend.enqueue(NewJob::from_job(&Grant { account: 1 }).unwrap()).await.unwrap();
    wait_for("QStash's delivery to be refused", async || refusals(&rig) >= 1).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs on a signature this clock calls not yet valid");
    skew.store(0, Ordering::SeqCst);
    wait_for("QStash's retry to run the job", async || runs.load(Ordering::SeqCst) >= 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
    assert_eq!(rig.backend.count_open().await.unwrap(), 0, "no failure record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_ten_minutes_ahead_leaves_the_job_a_record_unrun_when_qstash_stops_retrying() {
    let skew = Arc::new(AtomicI64::new(600));
    let rig = skewed(&skew).await;
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    // Cap 2: one retry, so QStash gives up within the test.
    rig.backend.enqueue(NewJob::from_job(&Grant { account: 2 }).unwrap().with_cap(2)).await.unwrap();
    wait_for("the job's failure record", async || rig.backend.count_open().await.unwrap() == 1).await;
    worker.shutdown().await;
    assert_eq!(refusals(&rig), 2, "both deliveries refused: the signature expired by this clock");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the job never ran");
}
