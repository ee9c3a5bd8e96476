//! The suite is only worth something if it fails on a broken backend. These wrap the in-memory
//! backend with a fault and check that the scenario reports it.

use std::time::Duration;

use redrive_conformance::{Capabilities, Subject};
use redrive_core::{
    Begin, Claim, Claimed, DeadLetter, Enqueue, Enqueued, FailureId, FailureQuery, FailureRecord, Hold, IdempotencyKey,
    Lease, Ledger, MemoryBackend, NewJob, Replay, ReplayOutcome, Result,
};
use serde_json::Value;

/// A queue whose acknowledgements are lost: `complete` answers Ok and changes nothing, so
/// every job comes back after its lease, as on a broker whose delete failed silently.
#[derive(Clone)]
struct AckLost(MemoryBackend);

impl Enqueue for AckLost {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        self.0.enqueue(job).await
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.0.enqueue_batch(jobs).await
    }
}

impl Claim for AckLost {
    async fn claim(&self, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        self.0.claim(max, lease, wait).await
    }
    async fn complete(&self, _lease: &Lease) -> Result<()> {
        Ok(())
    }
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        self.0.retry(lease, delay, error).await
    }
    async fn extend(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.0.extend(lease, by).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn dead_letter(&self, job: &Claimed, error: &str) -> Result<FailureRecord> {
        self.0.dead_letter(job, error).await
    }
}

impl DeadLetter for AckLost {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        self.0.list(query).await
    }
    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        self.0.get(id).await
    }
    async fn count_open(&self) -> Result<u64> {
        self.0.count_open().await
    }
    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        self.0.discard(id, reason, actor).await
    }
    async fn purge(&self, age: Duration) -> Result<u64> {
        self.0.purge(age).await
    }
}

impl Replay for AckLost {
    async fn replay(&self, id: &FailureId) -> Result<ReplayOutcome> {
        self.0.replay(id).await
    }
}

/// An effect ledger that remembers nothing: every attempt is fresh.
#[derive(Clone)]
struct Amnesiac;

impl Ledger for Amnesiac {
    async fn begin(&self, key: &IdempotencyKey, _payload: &Value, _hold: Duration) -> Result<Begin> {
        Ok(Begin::Fresh(Hold { key: key.clone(), token: "any".into() }))
    }
    async fn extend_hold(&self, _hold: &Hold, _by: Duration) -> Result<()> {
        Ok(())
    }
    async fn release_hold(&self, _hold: &Hold) -> Result<()> {
        Ok(())
    }
    async fn finish(&self, _hold: &Hold, _result: &Value) -> Result<()> {
        Ok(())
    }
}

fn caps() -> Capabilities {
    Capabilities { lease: Duration::from_millis(300), settle: Duration::from_millis(1200), ..Capabilities::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acks_without_a_ledger_are_caught_as_duplicated() {
    let queue = AckLost(MemoryBackend::new());
    let violation = redrive_conformance::replay(Subject { queue, ledger: Amnesiac, caps: caps() }).await.unwrap_err();
    let report = violation.report.expect("the scenario got as far as the key sort");
    assert_eq!(
        report.duplicated,
        [IdempotencyKey::builder("redrive_conformance_probe").fact("id", 1).build().unwrap()]
    );
    assert!(report.done_once.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_alone_keeps_lost_acks_to_one_effect() {
    let backend = MemoryBackend::new();
    let queue = AckLost(backend.clone());
    let report = redrive_conformance::replay(Subject { queue, ledger: backend, caps: caps() }).await.unwrap();
    assert_eq!(report.done_once.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_forgets_fails_the_race() {
    let backend = MemoryBackend::new();
    let violation =
        redrive_conformance::race(Subject { queue: backend, ledger: Amnesiac, caps: caps() }).await.unwrap_err();
    assert!(violation.message.contains("exactly one racing attempt"), "{violation}");
}
