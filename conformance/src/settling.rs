//! A settlement that meets a busy backend: completions refused for a while with a temporary
//! error, as SQLite refuses them while another process holds the write lock past the busy
//! timeout, or Postgres on a deadlock. The worker tries them again while it keeps the lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::kit::{Claim, Claimed, Kinds, Lease, Ledger, Renew};
use redrive_core::{Error, IdempotencyKey};
use tokio::time::Instant;

use crate::frozen::{forward_capabilities_and_records, forward_settlements};
use crate::harness::{Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Behaviour 28: Every completion of one worker is refused with a temporary error ("database is
/// locked") for a while after the first one is: three leases where the queue can renew, half a
/// lease where it cannot. A second worker, whose completions get through, runs beside it once
/// the first has run every job. Each job is completed by the attempt that ran it, claimed once (a
/// completion given up, or a lease let lapse while it is tried again, lets the other worker claim
/// the job: on a backend whose claim takes the key, it runs again), its effect once, no record.
pub async fn settle_retried<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("settle_retried", subject);
    let ids: Vec<u32> = (300..306).collect();
    let lease = run.s.timing.lease;
    let window = if run.s.queue.renewal().is_some() { lease * 3 } else { lease / 2 };
    let busy = Busy::new(run.s.queue.clone(), window);
    let jobs = ids.iter().map(|&id| Probe::new(id).new_job()).collect();
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;
    let worker = run.start_worker_on(busy.clone(), run.s.ledger.clone(), run.config(ids.len(), lease, lease * 10));
    run.wait_for_effects(ids.len()).await?;
    // The first worker pauses its own claims while it tries a settlement again; a lapsed lease
    // would be this one's to take.
    let other = run.start_worker_on(busy.watching(), run.s.ledger.clone(), run.config(ids.len(), lease, lease * 10));
    let completed = Arc::clone(&busy.log);
    let n = ids.len();
    run.wait_for("every completion to get through", || {
        let completed = Arc::clone(&completed);
        async move { completed.lock().unwrap().completed >= n }
    })
    .await?;
    run.settle().await;
    let stats = worker.shutdown().await;
    other.shutdown().await;
    let log = busy.log.lock().unwrap().clone();
    ensure!(run, log.refused >= 1, "the suite refused no completion: nothing was tested ({stats:?})");
    let twice: Vec<_> = log.claims.iter().filter(|(_, n)| **n > 1).map(|(k, n)| format!("{k} ×{n}")).collect();
    ensure!(
        run,
        twice.is_empty(),
        "a completion refused for a temporary reason should be tried again while the lease is kept, not left \
         to lapse: claimed again {twice:?} ({} refusals; {stats:?})",
        log.refused
    );
    run.report(&ids, &[]).await
}

#[derive(Debug, Clone, Default)]
struct Log {
    /// Claims per key.
    claims: HashMap<IdempotencyKey, u32>,
    /// Completions refused.
    refused: u32,
    /// Completions that got through.
    completed: usize,
    /// The end of the busy window, set by the first completion.
    busy_until: Option<Instant>,
}

/// The subject's queue as one worker sees it, its completions refused as busy for `window` from
/// the first one (none refused where `window` is zero). Clones share the log.
#[derive(Clone)]
struct Busy<Q> {
    inner: Q,
    window: Duration,
    log: Arc<Mutex<Log>>,
}

impl<Q: Clone> Busy<Q> {
    fn new(inner: Q, window: Duration) -> Self {
        Self { inner, window, log: Arc::default() }
    }

    /// The same queue for another worker, its claims counted in the same log, nothing refused.
    fn watching(&self) -> Self {
        Self { inner: self.inner.clone(), window: Duration::ZERO, log: Arc::clone(&self.log) }
    }
}

type R<T> = redrive_core::Result<T>;

forward_capabilities_and_records!(Busy);

impl<Q: Claim> Claim for Busy<Q> {
    fn handles(&self, kinds: &Kinds) {
        self.inner.handles(kinds);
    }
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> R<Vec<Claimed>> {
        let claimed = self.inner.claim(kinds, max, lease, wait).await?;
        let mut log = self.log.lock().unwrap();
        for c in &claimed {
            *log.claims.entry(c.job.key.clone()).or_default() += 1;
        }
        Ok(claimed)
    }
    async fn complete(&self, lease: &Lease, result: Option<&serde_json::Value>) -> R<()> {
        if !self.window.is_zero() {
            let mut log = self.log.lock().unwrap();
            let until = *log.busy_until.get_or_insert_with(|| Instant::now() + self.window);
            if Instant::now() < until {
                log.refused += 1;
                return Err(Error::temporary("database is locked (refused by the conformance suite)"));
            }
        }
        self.inner.complete(lease, result).await?;
        self.log.lock().unwrap().completed += 1;
        Ok(())
    }
    forward_settlements!();
}

impl<Q: Claim> Renew for Busy<Q> {
    async fn renew(&self, lease: &Lease, by: Duration) -> R<Lease> {
        let renewal = self.inner.renewal().expect("offered only where the inner queue renews");
        renewal.renew(lease, by).await
    }
    async fn renew_settling(&self, lease: &Lease, by: Duration) -> R<Lease> {
        let renewal = self.inner.renewal().expect("offered only where the inner queue renews");
        renewal.renew_settling(lease, by).await
    }
}
