//! One attempt at one job: the key's hold, the handler, and the settlement.
//!
//! The hold is one mechanism on every backend: an attempt whose handler runs holds its key, and
//! keeps holding it by renewing it (the ledger hold, or the lease where the hold is the lease)
//! whatever the heartbeat setting. If a renewal cannot get through before the hold would lapse,
//! the handler is cancelled first: two attempts of one key never run at once.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{Count, HandlerResult, Shared, panicked};
use crate::alert::BoxFuture;
use crate::backend::{Begin, Claim, Claimed, DeadLetter, Hold, Lease, Ledger, Renew};
use crate::error::{ErrorKind, Result};
use crate::job::{JobContext, JobError};
use crate::policy::{Backoff, Decision, Outcome};

/// A claimed job as its attempt goes: its lease as last renewed, and until when its key is held.
struct Attempt<'a> {
    claimed: &'a Claimed,
    lease: Mutex<Lease>,
    /// About when the current lease lapses, and how long a renewal makes it.
    lease_until: Mutex<Instant>,
    renews_for: Duration,
    held_until: Mutex<Instant>,
}

impl Attempt<'_> {
    fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn renewed(&self, lease: Lease) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
        *self.lease_until.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + self.renews_for;
    }

    fn lease_until(&self) -> Instant {
        *self.lease_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn held_until(&self) -> Instant {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hold_until(&self, until: Instant) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// The claim with its current lease, for the calls that take the whole job.
    fn claimed(&self) -> Claimed {
        Claimed { lease: self.lease(), ..self.claimed.clone() }
    }
}

/// How a handler's run ended.
enum Ran {
    Finished(HandlerResult),
    /// Shutdown's grace ran out.
    Abandoned,
    /// The key's hold could not be renewed; the handler was cancelled before it lapsed.
    HoldLapsing,
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    pub(super) async fn process(&self, claimed: Claimed, claimed_at: Instant, slot: OwnedSemaphorePermit) {
        let job = &claimed.job;
        if let Some(why) = &job.undecodable {
            // The backend could not read it: its kind and payload are stand-ins, so no handler
            // may see it, whatever kind it claims. Reading it again cannot succeed: no retries.
            return self.dead_letter(&claimed, why).await;
        }
        let Some(handler) = self.handlers.get(&job.kind) else {
            // A backend that cannot claim by kind gave us another worker's job (a rolling deploy,
            // workers that each run some kinds): hand it back, at no cost to the job.
            info!("no handler for this kind here; handed back for a worker that has one");
            self.counters.add_for(Count::Deferred, &job.kind, 1);
            return self.settle("hand back", || self.queue.defer(&claimed.lease, self.config.poll)).await;
        };
        let now = chrono::Utc::now();
        if let Some(wait) = job.not_before.and_then(|at| (at - now).to_std().ok()).filter(|w| !w.is_zero()) {
            // Received before its time (a broker's delay is capped): back until then, no attempt.
            info!(due_in_ms = wait.as_millis() as u64, "not due yet; put back until its time");
            self.counters.add_for(Count::Deferred, &job.kind, 1);
            return self.settle("put back", || self.queue.defer(&claimed.lease, wait)).await;
        }
        if job.deadline.is_some_and(|deadline| deadline < now) {
            // Worthless late: dropped, counted, not run, not a failure.
            info!("dropped unrun: claimed past its deadline");
            self.counters.add_for(Count::Expired, &job.kind, 1);
            return self.settle("drop", || self.queue.complete(&claimed.lease, None)).await;
        }
        // The hold starts when the ledger takes it: no later than now.
        let asked = Instant::now();
        let begin = match &claimed.begun {
            Some(begun) => Ok(begun.clone()),
            None => self.ledger.begin(&job.key, &job.payload, job.provider_key, self.config.lease).await,
        };
        let (hold, earlier_attempt_pending) = match begin {
            Ok(Begin::Fresh(hold)) => (hold, false),
            Ok(Begin::Resumed(hold)) => (hold, true),
            Ok(Begin::Done(_)) => {
                info!("skipped: the effect of this key is already done");
                self.counters.add_for(Count::Skipped, &job.kind, 1);
                return self.settle("complete", || self.queue.complete(&claimed.lease, None)).await;
            }
            Ok(Begin::Busy(held_for)) => {
                // Not a failure, and never a dead letter: another attempt is doing the work. Look
                // again when its hold ends, not sooner: nothing waits on this copy but its own
                // acknowledgement. A holder that dies lets the hold lapse, and then this copy runs.
                // At most a third of the lease: a hold far longer than the worker's own (taken by
                // a direct `Ledger::begin`) and released early is not waited out whole.
                let delay = held_for.min(self.config.lease / 3) + Duration::from_millis(10);
                info!(retry_in_ms = delay.as_millis() as u64, "deferred: another attempt holds this key");
                self.counters.add_for(Count::Deferred, &job.kind, 1);
                return self.settle("defer", || self.queue.defer(&claimed.lease, delay)).await;
            }
            Err(e) if e.kind() == ErrorKind::KeyConflict => {
                return self.dead_letter(&claimed, &format!("key reused with a different payload: {e}")).await;
            }
            Err(e) => {
                // The ledger, not the job, is at fault: put the job back at no cost and pause.
                let delay = self.infra.failed(self.config.lease);
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "effect ledger unavailable; deferred");
                self.counters.add_for(Count::Deferred, &job.kind, 1);
                return self.settle("defer", || self.queue.defer(&claimed.lease, delay)).await;
            }
        };
        self.infra.ok();
        let held_from = if hold.lease.is_some() { claimed_at } else { asked };
        let held_for = if hold.lease.is_some() { self.claim_lease } else { self.config.lease };
        let attempt = Attempt {
            claimed: &claimed,
            lease: Mutex::new(claimed.lease.clone()),
            lease_until: Mutex::new(claimed_at + self.claim_lease),
            renews_for: self.config.lease,
            held_until: Mutex::new(held_from + held_for),
        };
        if job.attempt > job.cap {
            // A worker died holding the lease on the last attempt: no attempt is left.
            self.release_hold(&hold).await;
            let error = format!(
                "attempt {} is past the cap of {}: the last attempt's worker lost its lease",
                job.attempt, job.cap
            );
            return self.dead_letter(&claimed, &error).await;
        }
        if job.stranded > 0 {
            // Claims of this job lapsed unstarted before, and were not charged: mark this one
            // started before the handler runs, so that a job that kills its worker at once is.
            self.mark_started(&attempt, &hold).await;
        }
        let ctx = JobContext {
            job_id: job.id.clone(),
            kind: job.kind.clone(),
            attempt: job.attempt,
            cap: job.cap,
            key: job.key.clone(),
            provider_key: hold.provider_key,
            earlier_attempt_pending,
        };
        let run = match handler.prepare(&job.payload, ctx) {
            Ok(run) => run,
            Err(e) => {
                self.release_hold(&hold).await;
                // Decoding again cannot succeed: no retries.
                return self.dead_letter(&attempt.claimed(), &format!("payload does not decode: {e}")).await;
            }
        };
        let started = Instant::now();
        metrics::counter!("redrive_handlers_started_total", "kind" => job.kind.clone()).increment(1);
        let ran = self.run_holding(&attempt, &hold, run).await;
        let took = started.elapsed();
        self.pace.record(took);
        metrics::histogram!("redrive_handler_seconds", "kind" => job.kind.clone()).record(took.as_secs_f64());
        drop(slot); // the handler is done: the next one may start while this one settles
        self.taken.notify_waiters(); // an idle handler is room for a claim
        let settle = async {
            let result = match ran {
                Ran::Finished(result) => result,
                Ran::Abandoned => {
                    self.release_hold(&hold).await;
                    info!("interrupted by shutdown; released for another worker at no attempt's cost");
                    self.counters.add_for(Count::Released, &job.kind, 1);
                    // Not charged: the job did not fail, the worker stopped. Charged, a job longer
                    // than the grace would end as a record after `cap` deploys. The key stays
                    // pending, so the next attempt knows it resumes.
                    return self.settle("release", || async { self.hand_back(&attempt.lease()).await }).await;
                }
                Ran::HoldLapsing => {
                    warn!("the key's hold could not be renewed: the handler was cancelled before it lapsed");
                    self.counters.add_for(Count::Cancelled, &job.kind, 1);
                    Err(JobError::retry("cancelled: the key's hold could not be renewed before it lapsed"))
                }
            };
            let outcome = match result {
                Ok(value) if hold.lease.is_some() => {
                    // The hold is the job's lease: done with its result in one fenced write, the
                    // one write that marks the effect done: it must get through.
                    debug!("done");
                    self.counters.add_for(Count::Succeeded, &job.kind, 1);
                    return self
                        .settle("complete", || async { self.queue.complete(&attempt.lease(), Some(&value)).await })
                        .await;
                }
                Ok(value) => {
                    if let Err(e) = self.retrying("mark the effect done", || self.ledger.finish(&hold, &value)).await {
                        // The effect happened; a next delivery would see the key pending and resume.
                        error!(error = %e, "could not mark the effect done in the ledger");
                    }
                    Outcome::Done(value)
                }
                Err(err) => {
                    self.release_hold(&hold).await;
                    match err.retry_delay() {
                        Some(after) => Outcome::Retry { after, error: err.message().to_owned() },
                        None => Outcome::Fail { error: err.message().to_owned() },
                    }
                }
            };
            self.decide(&attempt, outcome).await;
        };
        tokio::select! {
            () = settle => {}
            () = self.keep_lease_while_settling(&attempt) => unreachable!("it never returns"),
        }
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

    async fn release_hold(&self, hold: &Hold) {
        // A hold that is the job's lease ends when the job is settled.
        if hold.lease.is_none()
            && let Err(e) = self.ledger.release_hold(hold).await
        {
            debug!(error = %e, "could not release the key's hold; it lapses on its own");
        }
    }

    /// Moves the job to its full lease before the handler runs, which marks it started.
    async fn mark_started(&self, attempt: &Attempt<'_>, hold: &Hold) {
        let Some(renewal) = self.queue.renewal() else { return };
        let asked = Instant::now();
        match renewal.renew(&attempt.lease(), self.config.lease).await {
            Ok(lease) => {
                attempt.renewed(lease);
                if hold.lease.is_some() {
                    attempt.hold_until(asked + self.config.lease);
                }
            }
            Err(e) => warn!(error = %e, "could not mark the job started"),
        }
    }

    /// Beside a settlement that takes long (a database stall, a settlement tried again), keeps the
    /// job's lease alive: a quick handler's job is still on its short claim lease, and must not be
    /// taken again while its result is being written. It renews when a third of the claim lease
    /// is left on the current lease, not before: a settlement done by then (almost all of them)
    /// costs a timer and nothing more. A renewal that fails (the same busy database) is tried
    /// again soon, several times before the lease lapses; one that finds the lease gone stops.
    async fn keep_lease_while_settling(&self, attempt: &Attempt<'_>) {
        let margin = (self.claim_lease / 3).max(Duration::from_millis(10));
        let mut next = attempt.lease_until() - margin;
        loop {
            tokio::time::sleep_until(next).await;
            if let Some(renewal) = self.queue.renewal() {
                match renewal.renew(&attempt.lease(), self.config.lease).await {
                    Ok(lease) => attempt.renewed(lease),
                    Err(e) if e.kind() == ErrorKind::LeaseLost => return std::future::pending().await,
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

    /// Runs the handler while keeping its key held.
    async fn run_holding(&self, attempt: &Attempt<'_>, hold: &Hold, run: BoxFuture<'static, HandlerResult>) -> Ran {
        let mut run = AssertUnwindSafe(run).catch_unwind();
        let finished = |result: std::thread::Result<HandlerResult>| result.unwrap_or_else(|p| Err(panicked(p)));
        // A handler that is done at its first poll needs no timer. (That poll has a no-op waker;
        // a pending handler is polled again at once below, with the real one.)
        if let Some(result) = (&mut run).now_or_never() {
            return Ran::Finished(finished(result));
        }
        tokio::select! {
            result = &mut run => Ran::Finished(finished(result)),
            () = self.keep_alive(attempt, hold) => Ran::HoldLapsing,
            () = self.abandon.cancelled() => Ran::Abandoned,
        }
    }

    /// For as long as a handler runs (polled beside it, so it never holds the handler up): moves
    /// its job from the claim lease to the full lease, then keeps the key's hold alive and, with
    /// the heartbeat on, the lease. Returns only when the hold is about to lapse without a
    /// renewal having got through (or was taken over): the handler must stop.
    async fn keep_alive(&self, attempt: &Attempt<'_>, hold: &Hold) {
        let config = &self.config;
        let renewal = self.queue.renewal();
        let hold_is_lease = hold.lease.is_some();
        // Stop this long before the hold lapses: a cancelled handler needs a moment to stop.
        let margin = (self.claim_lease / 4).min(Duration::from_secs(1));
        let deadline = || attempt.held_until() - margin;
        // Until it takes: once the claim lease lapses, another worker may start the job.
        // Also with the claim lease as long as the lease: the renewal marks the job started, so
        // that a crash from here on charges it.
        let every = config.heartbeat.unwrap_or(config.lease / 3).max(Duration::from_millis(10));
        if let Some(renewal) = renewal {
            loop {
                let asked = Instant::now();
                match tokio::time::timeout_at(deadline(), renewal.renew(&attempt.lease(), config.lease)).await {
                    Ok(Ok(lease)) => {
                        attempt.renewed(lease);
                        if hold_is_lease {
                            attempt.hold_until(asked + config.lease);
                        }
                        break;
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::LeaseLost => {
                        warn!("the job's claim lease lapsed before its handler started; another worker may run it");
                        if hold_is_lease {
                            return;
                        }
                        break;
                    }
                    Ok(Err(e)) => {
                        warn!(error = %e, "could not move the job to its full lease; trying again");
                        tokio::time::sleep(
                            (self.claim_lease / 4).min(deadline().saturating_duration_since(Instant::now())),
                        )
                        .await;
                    }
                    Err(_) if hold_is_lease => return,
                    Err(_) => break,
                }
                if Instant::now() >= deadline() {
                    if hold_is_lease {
                        return;
                    }
                    break;
                }
            }
        }
        // The hold is kept alive for as long as the handler runs, heartbeat or not: it says "an
        // attempt is alive", so a redelivery meanwhile waits instead of repeating the effect.
        // The lease is extended only with the heartbeat on.
        let mut beat = Instant::now() + every;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(beat) => {}
                () = tokio::time::sleep_until(deadline()) => return,
            }
            beat += every;
            let asked = Instant::now();
            let extended = async {
                match renewal.filter(|_| hold_is_lease) {
                    Some(renewal) => renewal.renew(&attempt.lease(), config.lease).await.map(|l| attempt.renewed(l)),
                    None if hold_is_lease => Ok(()), // no renewal: the hold lasts its lease
                    None => self.ledger.extend_hold(hold, config.lease).await,
                }
            };
            match tokio::time::timeout_at(deadline(), extended).await {
                Ok(Ok(())) if hold_is_lease && renewal.is_none() => {}
                Ok(Ok(())) => attempt.hold_until(asked + config.lease),
                Ok(Err(e)) if e.kind() == ErrorKind::LeaseLost => {
                    warn!("another attempt took over the key's hold");
                    return;
                }
                Ok(Err(e)) => warn!(error = %e, "could not extend the key's hold; trying again at the next beat"),
                Err(_) => return,
            }
            if let Some(renewal) = renewal.filter(|_| config.heartbeat.is_some() && !hold_is_lease) {
                match tokio::time::timeout(every, renewal.renew(&attempt.lease(), config.lease)).await {
                    Ok(Ok(lease)) => attempt.renewed(lease),
                    Ok(Err(e)) => warn!(error = %e, "heartbeat failed; another worker may take this job"),
                    Err(_) => warn!("heartbeat timed out; another worker may take this job"),
                }
            }
        }
    }

    async fn decide(&self, attempt: &Attempt<'_>, outcome: Outcome) {
        let job = &attempt.claimed.job;
        match self.policy.decide(job.attempt, job.cap, &outcome) {
            Decision::Complete => {
                debug!("done");
                self.counters.add_for(Count::Succeeded, &job.kind, 1);
                self.settle("complete", || async { self.queue.complete(&attempt.lease(), None).await }).await;
            }
            Decision::RetryIn(delay) => {
                let error = error_of(&outcome);
                warn!(error, retry_in_ms = delay.as_millis() as u64, "attempt failed; retrying");
                self.counters.add_for(Count::Retried, &job.kind, 1);
                self.settle("retry", || async { self.queue.retry(&attempt.lease(), delay, error).await }).await;
            }
            Decision::DeadLetter => self.dead_letter(&attempt.claimed(), error_of(&outcome)).await,
        }
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) {
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
                self.handed_off.notify_one();
            }
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
        let mut failures = 0;
        let mut _unsettled = None;
        loop {
            let error = match call().await {
                Err(e) if e.is_temporary() && e.kind() != ErrorKind::LeaseLost && !self.abandon.is_cancelled() => e,
                done => return done,
            };
            failures += 1;
            // Claims wait until this lands (or is given up), however the call ends.
            _unsettled.get_or_insert_with(|| Unsettled::count(&self.unsettled));
            warn!(error = %error, failures, "could not {what}; trying again while the lease is kept");
            tokio::select! {
                () = tokio::time::sleep(pause.delay(failures)) => {}
                () = self.abandon.cancelled() => {}
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

/// One settlement being tried again, counted in [`Shared::unsettled`] while it lives.
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

fn error_of(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Done(_) => "",
        Outcome::Retry { error, .. } | Outcome::Fail { error } => error,
    }
}
