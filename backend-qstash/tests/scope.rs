//! The DLQ belongs to the QStash account, not to one app: two destinations on one token (two
//! apps, or staging and production) each see, replay, discard and purge only their own records.
//! And a replay QStash answers as deduplicated (nothing sent) is published again, not closed.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::{
    DeadLetter, EnqueueExt, ErrorKind, FailureQuery, FailureRecord, IdempotencyKey, Job, JobContext, JobError,
    KeyBuilder, RecordState, Replay, ReplayOutcome, RunningWorker, Worker,
};
use redrive_qstash::QStashBackend;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Charge {
    account: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", self.account)
    }
}

/// A worker whose handler fails its first `fail` runs for good (a record each) and then
/// succeeds; the keys it ran with.
fn worker(rig: &common::Rig, fail: u32) -> (RunningWorker, Arc<Mutex<Vec<IdempotencyKey>>>) {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let count = Arc::new(AtomicU32::new(0));
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Charge>(move |_job: Charge, ctx: JobContext| {
            let (seen, count) = (seen.clone(), count.clone());
            async move {
                seen.lock().unwrap().push(ctx.key.clone());
                if count.fetch_add(1, Ordering::SeqCst) < fail {
                    return Err(JobError::permanent("the card was declined"));
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .start();
    (worker, runs)
}

async fn open(backend: &QStashBackend) -> Vec<FailureRecord> {
    backend.list(&FailureQuery::open()).await.expect("the records can be listed")
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

#[tokio::test]
async fn two_destinations_on_one_account_each_see_only_their_own_records() {
    let emulator = Arc::new(common::emulator().start_local().await.expect("the emulator starts"));
    let staging = common::rig_on(emulator.clone(), |c| c).await;
    let production = common::rig_on(emulator.clone(), |c| c).await;
    let (staging_worker, _) = worker(&staging, u32::MAX);
    let (production_worker, _) = worker(&production, u32::MAX);
    staging.backend.enqueue_job(&Charge { account: 1 }).await.unwrap();
    production.backend.enqueue_job(&Charge { account: 2 }).await.unwrap();
    assert!(emulator.wait_for_dlq(2, Duration::from_secs(30)).await, "both jobs fail to the account's DLQ");
    let ours = open(&staging.backend).await;
    let theirs = open(&production.backend).await;
    assert_eq!(ours.len(), 1, "staging lists its own record only: {ours:?}");
    assert_eq!(theirs.len(), 1, "production lists its own record only: {theirs:?}");
    assert_ne!(ours[0].id, theirs[0].id);
    assert_eq!(staging.backend.count_open().await.unwrap(), 1, "and counts (and alerts) its own only");
    assert_eq!(production.backend.count_open().await.unwrap(), 1);

    // Another app's entry is not this app's to read, replay or discard.
    let other = &theirs[0].id;
    assert_eq!(staging.backend.get(other).await.unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(staging.backend.replay(other, "", "ops").await.unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(staging.backend.discard(other, "not ours", "ops").await.unwrap_err().kind(), ErrorKind::NotFound);

    // A discard and a purge in staging leave production's entry in the DLQ.
    staging.backend.discard(&ours[0].id, "a test card", "ops").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    staging.backend.purge(Duration::ZERO).await.unwrap();
    let left: Vec<String> =
        emulator.dlq_entries().iter().map(|e| e["url"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(left, std::slice::from_ref(&production.destination), "production's entry is still in the DLQ");
    let theirs_after = open(&production.backend).await;
    assert_eq!(theirs_after.iter().map(|r| &r.id).collect::<Vec<_>>(), [other], "and still production's record");

    // The same job in both apps: neither app's enqueue is swallowed as the other's duplicate.
    let same = production.backend.enqueue_job(&Charge { account: 1 }).await.unwrap();
    assert!(same.is_created(), "the other destination's job is not a duplicate of this one's: {same:?}");
    assert!(emulator.wait_for_dlq(2, Duration::from_secs(30)).await, "it runs, and fails, in production too");
    staging_worker.shutdown().await;
    production_worker.shutdown().await;
}

#[tokio::test]
async fn a_replay_qstash_answers_as_deduplicated_is_published_again_under_a_fresh_id() {
    // The job fails at once, inside QStash's deduplication window: QStash's DLQ retry keeps the
    // message's deduplication id, answers `deduplicated` and sends nothing.
    let rig = common::rig().await;
    let (worker, runs) = worker(&rig, 1);
    rig.backend.enqueue_job(&Charge { account: 3 }).await.unwrap();
    let backend = rig.backend.clone();
    wait_for("a failure record", async || !open(&backend).await.is_empty()).await;
    let record = open(&rig.backend).await.pop().unwrap();
    let outcome = rig.backend.replay(&record.id, "", "ops").await.expect("the replay is sent");
    assert!(matches!(outcome, ReplayOutcome::Replayed(_)), "{outcome:?}");
    let seen = runs.clone();
    wait_for("the replayed job to run again", async || seen.lock().unwrap().len() >= 2).await;
    worker.shutdown().await;
    let keys = runs.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "the job ran once more: {keys:?}");
    assert_eq!(keys[0], keys[1], "with the same idempotency key");
    let closed = rig.backend.get(&record.id).await.unwrap();
    assert!(matches!(closed.state, RecordState::Confirmed { .. }), "confirmed by its effect: {:?}", closed.state);
    assert!(open(&rig.backend).await.is_empty(), "the replay succeeded: nothing open");
}
