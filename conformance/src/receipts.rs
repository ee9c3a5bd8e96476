//! What fences a job (an SQS receipt handle, an Azure pop receipt, a lease or hold token) is a
//! credential for that job: whoever has it can settle the job. It must never reach a log line or
//! an error's text, on the ordinary paths or the error paths.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redrive_core::kit::{Begin, Claim, Claimed, Hold, Kinds, Lease, Ledger, Renew};
use redrive_core::{IdempotencyKey, ProviderKey};
use serde_json::Value;

use crate::frozen::{forward_capabilities_and_records, forward_settlements};
use crate::harness::{Fault, Probe, Run, ensure};
use crate::logs::LogWatch;
use crate::{Outcome, Queue, Subject};

/// A token, and whether a log line has held it.
type Watch = (String, Arc<AtomicBool>);

/// The tokens a worker was handed, each watched for in the log.
#[derive(Clone, Default)]
struct Tokens(Arc<Mutex<Vec<Watch>>>);

/// Shorter tokens could match unrelated text; every backend's are longer.
const SHORTEST: usize = 8;

impl Tokens {
    fn watch(&self, token: &str) {
        let mut tokens = self.0.lock().unwrap();
        if token.len() >= SHORTEST && !tokens.iter().any(|(t, _)| t == token) {
            let watch = LogWatch::get().expect("checked when the scenario starts");
            tokens.push((token.to_owned(), watch.watch(token)));
        }
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// A token written to the log, if any.
    fn logged(&self) -> Option<String> {
        self.0.lock().unwrap().iter().find(|(_, seen)| seen.load(Ordering::SeqCst)).map(|(t, _)| t.clone())
    }

    fn quoted_by(&self, text: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(t, _)| text.contains(t.as_str()))
    }
}

/// A queue or ledger whose every lease and hold token is watched for.
#[derive(Clone)]
struct Watched<T> {
    inner: T,
    tokens: Tokens,
}

type R<T> = redrive_core::Result<T>;

forward_capabilities_and_records!(Watched);

impl<T: Claim> Claim for Watched<T> {
    fn handles(&self, kinds: &Kinds) {
        self.inner.handles(kinds);
    }
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> R<Vec<Claimed>> {
        let claimed = self.inner.claim(kinds, max, lease, wait).await?;
        claimed.iter().for_each(|c| self.tokens.watch(&c.lease.token));
        Ok(claimed)
    }
    async fn complete(&self, lease: &Lease, result: Option<&Value>) -> R<()> {
        self.inner.complete(lease, result).await
    }
    forward_settlements!();
}

impl<T: Claim> Renew for Watched<T> {
    async fn renew(&self, lease: &Lease, by: Duration) -> R<Lease> {
        let renewal = self.inner.renewal().expect("offered only where the inner backend renews");
        let renewed = renewal.renew(lease, by).await?;
        self.tokens.watch(&renewed.token);
        Ok(renewed)
    }
    async fn renew_settling(&self, lease: &Lease, by: Duration) -> R<Lease> {
        let renewal = self.inner.renewal().expect("offered only where the inner backend renews");
        let renewed = renewal.renew_settling(lease, by).await?;
        self.tokens.watch(&renewed.token);
        Ok(renewed)
    }
}

impl<T: Ledger> Ledger for Watched<T> {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> R<Begin> {
        let begin = self.inner.begin(key, payload, provider_key, hold).await?;
        if let Begin::Fresh(h) | Begin::Resumed(h) = &begin {
            self.tokens.watch(&h.token);
        }
        Ok(begin)
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> R<()> {
        self.inner.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> R<()> {
        self.inner.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &Value) -> R<()> {
        self.inner.finish(hold, result).await
    }
    async fn cancel_effect(
        &self,
        key: &redrive_core::IdempotencyKey,
        reason: &str,
        actor: &str,
    ) -> R<redrive_core::CancelOutcome> {
        self.inner.cancel_effect(key, reason, actor).await
    }
    fn flow(&self) -> Option<&impl redrive_core::Flow> {
        self.inner.flow()
    }
}

/// Behaviour 29: No lease token (SQS receipt handle, Azure pop receipt, a database's lease or
/// hold token) appears in a log line or an error's text: through a job done, one retried, one
/// recorded, and settlements presented with a lease that has lapsed and been taken again.
pub async fn no_receipt_in_logs<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("no_receipt_in_logs", subject);
    if LogWatch::get().is_none() {
        return Err(run.fail("another tracing subscriber is installed for the process: logs cannot be captured"));
    }
    let tokens = Tokens::default();
    let queue = Watched { inner: run.s.queue.clone(), tokens: tokens.clone() };
    let ledger = Watched { inner: run.s.ledger.clone(), tokens: tokens.clone() };

    // The worker's paths: done, retried then done, recorded.
    run.script.fault(71, Fault::First(1));
    run.script.fault(72, Fault::Permanent);
    for id in [70, 71, 72] {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(id).new_job()).await)?;
    }
    let worker = run.start_worker_on(queue.clone(), ledger, run.config(2, run.s.timing.lease, Duration::from_secs(30)));
    run.wait_for_records(1).await?;
    run.wait_for_effects(2).await?;
    run.settle().await;
    worker.shutdown().await;

    // The error paths: every settlement presented with a lease that lapsed and was taken again.
    run.must("enqueue", run.s.queue.enqueue(Probe::new(73).new_job()).await)?;
    let short = run.short_lease();
    let first = run.must("claim", queue.claim(&Kinds::Any, 1, short, run.s.timing.timeout).await)?;
    ensure!(run, first.len() == 1, "the job should be claimable");
    let again: Arc<Mutex<Vec<Claimed>>> = Arc::default();
    run.wait_for("the lapsed job to be claimable again", || {
        let (queue, again) = (queue.clone(), Arc::clone(&again));
        async move {
            let claimed = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await;
            let mut again = again.lock().unwrap();
            again.extend(claimed.unwrap_or_default());
            !again.is_empty()
        }
    })
    .await?;
    let again = again.lock().unwrap().clone();
    let stale = &first[0];
    let mut errors = Vec::new();
    errors.extend(queue.complete(&stale.lease, None).await.err());
    errors.extend(queue.retry(&stale.lease, Duration::ZERO, "a stale retry").await.err());
    errors.extend(queue.defer(&stale.lease, Duration::ZERO).await.err());
    errors.extend(queue.release(&stale.lease).await.err());
    if let Some(renewal) = queue.renewal() {
        errors.extend(renewal.renew(&stale.lease, short).await.err());
    }
    let forged = Lease { job_id: stale.lease.job_id.clone(), token: format!("{}-forged", stale.lease.token) };
    errors.extend(queue.complete(&forged, None).await.err());
    for e in &errors {
        ensure!(run, !tokens.quoted_by(&e.to_string()), "an error quotes a lease token: {e}");
    }
    // Whatever the stale calls did (a broker may honour an old receipt), the job is settled.
    let _ = queue.complete(&again[0].lease, None).await;

    ensure!(
        run,
        tokens.count() >= 4,
        "the scenario should have watched the tokens of every claim ({})",
        tokens.count()
    );
    if let Some(token) = tokens.logged() {
        return Err(run.fail(format!("a lease token was written to the log ({} characters)", token.len())));
    }
    run.report(&[70, 71], &[72]).await
}
