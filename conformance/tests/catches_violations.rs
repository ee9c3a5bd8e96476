//! The suite is only worth something if it fails on a broken backend. These wrap the in-memory
//! backend with a fault and check that the scenario reports it.

use std::time::Duration;

use redrive_conformance::{Capabilities, Subject};
use redrive_core::{
    Begin, Claim, Claimed, DeadLetter, Enqueue, Enqueued, FailureId, FailureQuery, FailureRecord, Hold, IdempotencyKey,
    Lease, Ledger, MemoryBackend, NewJob, Replay, ReplayOutcome, Result,
};
use serde_json::Value;

/// The in-memory backend with one fault.
#[derive(Clone)]
struct Broken(MemoryBackend, Fault);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Acknowledgements are lost: `complete` answers Ok and changes nothing, so every job comes
    /// back after its lease, as on a broker whose delete failed silently.
    AckLost,
    /// Claims ignore the lease asked for and hold jobs eight times as long, as a backend with a
    /// fixed visibility timeout would.
    FixedLease,
    /// The ledger's holds cannot be extended: a key is held for the first lease only.
    HoldNotExtended,
}

impl Enqueue for Broken {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        self.0.enqueue(job).await
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.0.enqueue_batch(jobs).await
    }
}

impl Claim for Broken {
    async fn claim(&self, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let lease = if self.1 == Fault::FixedLease { lease * 8 } else { lease };
        self.0.claim(max, lease, wait).await
    }
    async fn complete(&self, lease: &Lease) -> Result<()> {
        if self.1 == Fault::AckLost {
            return Ok(());
        }
        self.0.complete(lease).await
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

impl DeadLetter for Broken {
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

impl Replay for Broken {
    async fn replay(&self, id: &FailureId) -> Result<ReplayOutcome> {
        self.0.replay(id).await
    }
}

impl Ledger for Broken {
    async fn begin(&self, key: &IdempotencyKey, payload: &Value, hold: Duration) -> Result<Begin> {
        self.0.begin(key, payload, hold).await
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        if self.1 == Fault::HoldNotExtended {
            return Ok(());
        }
        self.0.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        self.0.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        self.0.finish(hold, result).await
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
    let queue = Broken(MemoryBackend::new(), Fault::AckLost);
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
    let queue = Broken(backend.clone(), Fault::AckLost);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_holds_claims_for_the_whole_lease_fails_stranded_claims() {
    let backend = MemoryBackend::new();
    let queue = Broken(backend.clone(), Fault::FixedLease);
    let caps = Capabilities { lease: Duration::from_millis(500), ..caps() };
    let violation = redrive_conformance::stranded_claims(Subject { queue, ledger: backend, caps }).await.unwrap_err();
    assert!(violation.message.contains("claimed ahead and never started"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_whose_holds_lapse_under_a_slow_handler_fails_slow_handler() {
    let backend = MemoryBackend::new();
    let ledger = Broken(backend.clone(), Fault::HoldNotExtended);
    let caps = Capabilities { lease: Duration::from_secs(1), ..caps() };
    let violation = redrive_conformance::slow_handler(Subject { queue: backend, ledger, caps }).await.unwrap_err();
    assert!(violation.message.contains("with the heartbeat off, the slow handler started"), "{violation}");
}
