//! Settlements: a job completed, retried, deferred, released or recorded, each tried again while
//! it fails for a temporary reason, with the job's lease kept meanwhile.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::attempt::Attempt;
use super::{Count, Shared};
use crate::backend::{Claim, Claimed, DeadLetter, Lease, Ledger, Renew};
use crate::error::{ErrorKind, Result};
use crate::policy::Backoff;

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// Gives back a claimed job whose handler never started: the job must not pay for it.
    pub(super) async fn give_back(&self, claimed: &Claimed) {
        debug!("handed back before it started");
        self.counters.add_for(Count::HandedBack, &claimed.job.kind, 1);
        self.settle("hand back", || self.hand_back(&claimed.lease)).await;
    }

    /// Gives a job back without charging its attempt. Where a release keeps the attempt (SQS
    /// counts the receive), a deferral without delay gives it back.
    pub(super) async fn hand_back(&self, lease: &Lease) -> Result<()> {
        if self.caps.release_refunds {
            self.queue.release(lease).await
        } else {
            self.queue.defer(lease, Duration::ZERO).await
        }
    }

    /// Writes the job's failure record, then alerts. The record keeps the trace id of the
    /// traceparent handed over (see [`Claim::dead_letter`]): with the `otel` feature, the failing
    /// attempt's own, where its span has a context; else the producer's, as the job carries it.
    pub(super) async fn dead_letter(&self, claimed: &Claimed, error: &str) {
        #[cfg(feature = "otel")]
        let failing = crate::trace::otel::traceparent_of(&tracing::Span::current()).map(|traceparent| Claimed {
            job: crate::job::JobRecord { traceparent: Some(traceparent), ..claimed.job.clone() },
            ..claimed.clone()
        });
        #[cfg(feature = "otel")]
        let claimed = failing.as_ref().unwrap_or(claimed);
        let record = match self.queue.dead_letter(claimed, error).await {
            Ok(record) => record,
            // Not tried again: on a broker a record is a message sent and one deleted, and a retry
            // after the send got through would send a second. A job whose record was not written
            // comes back after its lease, with no effect to repeat, and ends as a record then.
            Err(e) => return self.settled("write the failure record", Err(e)),
        };
        self.counters.add_for(Count::DeadLettered, &claimed.job.kind, 1);
        match record {
            Some(record) => {
                warn!(record = %record.id, error, "failure record written");
                self.alert(record).await;
            }
            None => {
                warn!(job = %claimed.job.id, kind = %claimed.job.kind, key = %claimed.job.key, error,
                    "handed to the service's dead-letter queue; alerted once it is listed there");
                self.alerting.handed_off();
            }
        }
    }

    /// Beside a settlement that takes long (a database stall, a settlement tried again), keeps the
    /// job's lease alive: a quick handler's job is still on its short claim lease, and must not be
    /// taken again while its result is being written. It renews when a third of the claim lease
    /// is left on the current lease, not before: a settlement done by then (almost all of them)
    /// costs a timer and nothing more. A renewal that fails (the same busy database) is tried
    /// again soon, several times before the lease lapses; one that finds the lease gone stops.
    pub(super) async fn keep_lease_while_settling(&self, attempt: &Attempt<'_>) {
        let margin = (self.claim_lease / 3).max(Duration::from_millis(10));
        let mut next = attempt.lease_until() - margin;
        loop {
            tokio::time::sleep_until(next).await;
            if let Some(renewal) = self.queue.renewal() {
                // Renewed even if a person cancelled it since: the settlement decides now.
                match renewal.renew_settling(&attempt.lease(), self.config.lease).await {
                    Ok(lease) => attempt.renewed(lease),
                    // Lost (or refused by a renewal that heeds a cancel): the settlement has the
                    // rest of the lease.
                    Err(e) if matches!(e.kind(), ErrorKind::LeaseLost | ErrorKind::Cancelled) => {
                        return std::future::pending().await;
                    }
                    Err(e) => {
                        debug!(error = %e, "could not extend the lease of a job being settled; trying again");
                        next = Instant::now() + margin / 8;
                        continue;
                    }
                }
            }
            next = (attempt.lease_until() - margin).max(Instant::now() + margin);
        }
    }

    /// Settles a job with `call` (a completion, a retry, a deferral, a release), tried again
    /// while it fails for a temporary reason (a busy or locked database, a deadlock, a lost
    /// connection; the error's retry flag says). A settlement given up leaves the job to come back
    /// after its lease; where the claim took the key (SQLite, Postgres), a completion is the one
    /// write that marks the effect done, so the job would run again. A handler's job keeps its
    /// lease meanwhile (`keep_lease_while_settling`).
    pub(super) async fn settle<F, Fut>(&self, what: &str, call: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        self.settled(what, self.retrying(what, call).await);
    }

    /// Runs `call` until it succeeds, fails for good, finds its lease taken, or shutdown's grace
    /// ends, pausing between tries (from 20 ms up to 2 s).
    pub(super) async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let pause = Backoff { base: Duration::from_millis(20), max: Duration::from_secs(2), ..Backoff::default() };
        let abandon = self.attempts.abandon();
        let mut failures = 0;
        let mut _unsettled = None;
        loop {
            let error = match call().await {
                Err(e) if e.is_temporary() && e.kind() != ErrorKind::LeaseLost && !abandon.is_cancelled() => e,
                done => return done,
            };
            failures += 1;
            // Claims wait until this lands (or is given up), however the call ends.
            _unsettled.get_or_insert_with(|| Unsettled::count(&self.attempts.unsettled));
            warn!(error = %error, failures, "could not {what}; trying again while the lease is kept");
            tokio::select! {
                () = tokio::time::sleep(pause.delay(failures)) => {}
                () = abandon.cancelled() => {}
            }
        }
    }

    /// Logs how a settlement ended.
    pub(super) fn settled(&self, what: &str, result: Result<()>) {
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                warn!("lease lost: another worker holds this job now; nothing was changed");
                self.counters.add(Count::LeaseLost, 1);
            }
            Err(e) => error!(error = %e, "could not {what}; the job returns after its lease"),
        }
    }
}

/// One settlement being tried again, counted in [`Attempts::unsettled`](super::attempt::Attempts)
/// while it lives.
struct Unsettled<'a>(&'a AtomicUsize);

impl<'a> Unsettled<'a> {
    fn count(unsettled: &'a AtomicUsize) -> Self {
        unsettled.fetch_add(1, Ordering::Relaxed);
        Self(unsettled)
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
