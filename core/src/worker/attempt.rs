//! One attempt at one job: admission asked and carried out, the handler run while its key is
//! held, and the retry policy's decision carried out. What to do is decided by pure functions
//! (`admission::admit`, [`RetryPolicy::decide`]); this file only asks and obeys.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::admission::{Admission, Deferral, Facts, Rules, Unrun, admit};
use super::flow::Gate;
use super::handler::{Erased, panicked};
use super::hold::{Held, HoldMode, Stop};
use super::{Count, HandlerResult, Shared, WorkerConfig};
use crate::alert::BoxFuture;
use crate::backend::{Cancellation, Claim, Claimed, DeadLetter, Lease, Ledger, Slot};
use crate::job::{JobContext, JobError, JobRecord};
use crate::policy::{Decision, Outcome, RetryPolicy};

/// The part of the worker that runs attempts: the handlers, the policies it asks, and the state
/// of its settlements.
pub(super) struct Attempts {
    handlers: HashMap<String, Arc<dyn Erased>>,
    /// The longest one attempt of a kind may run, where it is limited.
    timeouts: HashMap<String, Duration>,
    /// What follows a run.
    policy: RetryPolicy,
    /// What admission reads.
    rules: Rules,
    /// Settlements being tried again after a temporary failure. Claims wait while there are any:
    /// a claim also sweeps expired leases back to the queue (Postgres), and a job whose completion
    /// is still on its way must not be taken again before it lands.
    pub(super) unsettled: AtomicUsize,
    /// Cancelled when shutdown's grace ends: running handlers are released, and settlements
    /// failing for a temporary reason are not tried again.
    abandon: CancellationToken,
}

impl Attempts {
    /// `timeouts` are the worker's own limits by kind, over the job types'.
    pub(super) fn new(
        handlers: HashMap<String, Arc<dyn Erased>>,
        mut timeouts: HashMap<String, Duration>,
        config: &WorkerConfig,
        claim_lease: Duration,
    ) -> Self {
        for (kind, handler) in &handlers {
            if let Some(limit) = handler.timeout() {
                timeouts.entry(kind.clone()).or_insert(limit);
            }
        }
        Self {
            handlers,
            timeouts,
            policy: RetryPolicy { backoff: config.backoff, max_not_now: config.max_not_now },
            rules: Rules { lease: config.lease, claim_lease, poll: config.poll, jitter: true },
            unsettled: AtomicUsize::new(0),
            abandon: CancellationToken::new(),
        }
    }

    /// Cancelled when shutdown's grace ends.
    pub(super) fn abandon(&self) -> &CancellationToken {
        &self.abandon
    }

    /// Settlements being tried again right now.
    pub(super) fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::Relaxed)
    }
}

/// A claimed job as its attempt goes: its lease as last renewed, and until when its key is held.
pub(super) struct Attempt<'a> {
    pub(super) claimed: &'a Claimed,
    lease: Mutex<Lease>,
    /// About when the current lease lapses, and how long a renewal makes it.
    lease_until: Mutex<Instant>,
    renews_for: Duration,
    held_until: Mutex<Instant>,
    /// How long before its hold lapses a handler is stopped: a cancelled handler needs a moment
    /// to stop.
    margin: Duration,
    /// The concurrency slots its limits took, given back when it is settled.
    slots: Mutex<Vec<Slot>>,
    /// Whether it runs as its kind's breaker probe.
    probe: std::sync::atomic::AtomicBool,
}

impl<'a> Attempt<'a> {
    fn new(claimed: &'a Claimed, claimed_at: Instant, claim_lease: Duration, lease: Duration) -> Self {
        Self {
            claimed,
            lease: Mutex::new(claimed.lease.clone()),
            lease_until: Mutex::new(claimed_at + claim_lease),
            renews_for: lease,
            // Until the key's hold is taken, the claim is all there is.
            held_until: Mutex::new(claimed_at + claim_lease),
            margin: (claim_lease / 4).min(Duration::from_secs(1)),
            slots: Mutex::default(),
            probe: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(super) fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn probe(&self) -> bool {
        self.probe.load(Ordering::Relaxed)
    }

    pub(super) fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn renewed(&self, lease: Lease) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
        *self.lease_until.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + self.renews_for;
    }

    pub(super) fn lease_until(&self) -> Instant {
        *self.lease_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn hold_until(&self, until: Instant) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// When a handler still running must be stopped: a margin before its key's hold lapses.
    pub(super) fn stop_by(&self) -> Instant {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) - self.margin
    }

    /// The claim with its current lease, for the calls that take the whole job.
    pub(super) fn claimed(&self) -> Claimed {
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
    /// A person cancelled the job ([`Jobs::cancel_job`](crate::Jobs::cancel_job)); the handler
    /// was stopped.
    Stopped,
    /// The handler ran to its kind's timeout, and was cancelled there.
    TimedOut(Duration),
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// One claimed job, from admission to settlement. `slot` is its handler's place, given up
    /// as soon as the handler returns; `outstanding` bounds the jobs between dispatch and
    /// settlement.
    pub(super) async fn process(
        &self,
        claimed: Claimed,
        claimed_at: Instant,
        slot: OwnedSemaphorePermit,
        outstanding: OwnedSemaphorePermit,
    ) {
        let attempt = Attempt::new(&claimed, claimed_at, self.claim_lease, self.config.lease);
        self.attempt(&attempt, claimed_at, slot, outstanding).await;
        // Settled (or put back): the next job of its kind or key may take its slots.
        self.release_slots(&attempt).await;
    }

    async fn attempt(
        &self,
        attempt: &Attempt<'_>,
        claimed_at: Instant,
        slot: OwnedSemaphorePermit,
        outstanding: OwnedSemaphorePermit,
    ) {
        let claimed = attempt.claimed;
        let job = &claimed.job;
        let handler = self.attempts.handlers.get(&job.kind);
        // What the store says of its kind, at most a poll old (a pause made here just now is
        // read again first).
        self.refresh_flow().await;
        let mut facts = Facts::claimed(job, handler.is_some(), chrono::Utc::now(), claimed_at.elapsed());
        facts.flow_ruled = self.flowing.ruled(&job.kind);
        let mut held: Option<Held> = None;
        // Admission is asked again each time the mechanics learn what it asked for: the key's
        // hold, then whether the payload decodes.
        let (held, run) = loop {
            match admit(&facts, &self.attempts.rules) {
                Admission::CheckFlow => {
                    let gate = self.gate(attempt, handler.map(|h| h.as_ref())).await;
                    attempt.probe.store(gate == Gate::Probe, Ordering::Relaxed);
                    facts.gate = Some(gate);
                }
                Admission::TakeHold => facts.key = Some(self.take_hold(attempt, claimed_at, &mut held).await),
                Admission::Run { earlier_attempt_pending, mark_started } => {
                    let (Some(handler), Some(held)) = (handler, &held) else {
                        unreachable!("admission runs a job only with a handler and its key held")
                    };
                    if mark_started && self.mark_started(attempt, held).await == Err(Stop::Cancelled) {
                        self.hand_in_slots(attempt);
                        return self.conclude(attempt, held, Ran::Stopped).await;
                    }
                    let ctx = JobContext {
                        job_id: job.id.clone(),
                        kind: job.kind.clone(),
                        attempt: job.attempt,
                        cap: job.cap,
                        key: job.key.clone(),
                        provider_key: held.hold.provider_key,
                        earlier_attempt_pending,
                        traceparent: job.traceparent.clone(),
                    };
                    match handler.prepare(&job.payload, ctx) {
                        Ok(run) => break (held, run),
                        Err(e) => facts.payload_error = Some(e),
                    }
                }
                Admission::Release => {
                    self.hand_in_slots(attempt);
                    // Its slot is free at once: room for a claim.
                    drop((slot, outstanding));
                    self.claiming.room_made();
                    return self.give_back(claimed).await;
                }
                // Nothing runs: the slots its limits took go back before a settlement that may
                // be tried again for a while.
                Admission::Defer { delay, why } => {
                    self.hand_in_slots(attempt);
                    return self.defer(attempt, delay, why).await;
                }
                Admission::Complete(unrun) => {
                    self.hand_in_slots(attempt);
                    return self.complete_unrun(attempt, unrun).await;
                }
                Admission::DeadLetter(error) => {
                    self.hand_in_slots(attempt);
                    if let Some(held) = &held {
                        self.release_hold(held).await;
                    }
                    return self.dead_letter(&attempt.claimed(), &error).await;
                }
            }
        };
        let started = Instant::now();
        metrics::counter!("redrive_handlers_started_total", "kind" => job.kind.clone()).increment(1);
        let timeout = self.attempts.timeouts.get(&job.kind).copied();
        let ran = self.run_holding(attempt, held, run, timeout).await;
        let took = started.elapsed();
        self.claiming.handler_took(took);
        metrics::histogram!("redrive_handler_seconds", "kind" => job.kind.clone()).record(took.as_secs_f64());
        drop(slot); // the handler is done: the next one may start while this one settles
        self.hand_in_slots(attempt);
        self.claiming.room_made(); // an idle handler is room for a claim
        tokio::select! {
            () = self.conclude(attempt, held, ran) => {}
            () = self.keep_lease_while_settling(attempt) => unreachable!("it never returns"),
        }
    }

    /// Puts a job back unrun, at no attempt's cost.
    async fn defer(&self, attempt: &Attempt<'_>, delay: Duration, why: Deferral) {
        let in_ms = delay.as_millis() as u64;
        let what = match &why {
            Deferral::NotHandledHere => {
                info!("no handler for this kind here; handed back for a worker that has one");
                "hand back"
            }
            Deferral::NotDue => {
                info!(due_in_ms = in_ms, "not due yet; put back until its time");
                "put back"
            }
            Deferral::KeyBusy => {
                info!(retry_in_ms = in_ms, "deferred: another attempt holds this key");
                "defer"
            }
            Deferral::LedgerDown { error } => {
                // Claims pause too: the next jobs would find the ledger down as well.
                self.claiming.pause_for(delay);
                warn!(error = %error, retry_in_ms = in_ms, "effect ledger unavailable; deferred");
                "defer"
            }
            Deferral::Paused { by } => {
                info!(paused_by = %by, retry_in_ms = in_ms, "its kind is paused; put back");
                "put back"
            }
            Deferral::RateLimited => {
                debug!(retry_in_ms = in_ms, "its rate limit is spent; put back until a start is free");
                "put back"
            }
            Deferral::AtLimit => {
                debug!(retry_in_ms = in_ms, "its concurrency limit is full; put back");
                "put back"
            }
        };
        self.counters.add_for(Count::Deferred, &attempt.claimed.job.kind, 1);
        self.settle(what, || self.queue.defer(&attempt.claimed.lease, delay)).await;
    }

    /// Completes a job without running it.
    async fn complete_unrun(&self, attempt: &Attempt<'_>, unrun: Unrun) {
        let (count, what) = match unrun {
            Unrun::AlreadyDone => {
                info!("skipped: the effect of this key is already done");
                (Count::Skipped, "complete")
            }
            Unrun::Expired => {
                info!("dropped unrun: claimed past its deadline");
                (Count::Expired, "drop")
            }
            Unrun::Withdrawn(_) => {
                info!("completed unrun: a person cancelled its key");
                (Count::Withdrawn, "drop")
            }
        };
        self.counters.add_for(count, &attempt.claimed.job.kind, 1);
        match &unrun {
            Unrun::AlreadyDone => self.confirm_replay(&attempt.claimed.job).await,
            Unrun::Withdrawn(cancel) => self.withdraw_replay(&attempt.claimed.job, cancel).await,
            Unrun::Expired => {}
        }
        self.settle(what, || self.queue.complete(&attempt.claimed.lease, None)).await;
    }

    /// Confirms the record a job replays, where the job carries it (a broker's): its effect is
    /// done. Before the completion, so that a crash between the two leaves a job that runs
    /// again, finds its effect done, and confirms then. A record left replaying by a failure
    /// here is logged; the job is completed all the same (its effect is done).
    async fn confirm_replay(&self, job: &JobRecord) {
        let Some(record) = &job.replay_of else { return };
        if let Err(e) = self.retrying("confirm the replay", || self.queue.confirm_replay(record)).await {
            warn!(record = %record, error = %e, "could not confirm the replay; its record stays replaying");
        }
    }

    /// Closes the record a job replays, where the job carries it (a broker's), as discarded: its
    /// key was cancelled, so the job completes unrun and nothing else would settle the record.
    /// Before the completion, for the reason `confirm_replay` gives.
    async fn withdraw_replay(&self, job: &JobRecord, cancel: &Cancellation) {
        let Some(record) = &job.replay_of else { return };
        if let Err(e) = self.retrying("close the withdrawn replay", || self.queue.withdraw_replay(record, cancel)).await
        {
            warn!(record = %record, error = %e, "could not close the withdrawn replay; its record stays replaying");
        }
    }

    /// Runs the handler while keeping its key held, for at most `timeout`. A handler stopped
    /// early is dropped here, whatever it was awaiting.
    async fn run_holding(
        &self,
        attempt: &Attempt<'_>,
        held: &Held,
        run: BoxFuture<'static, HandlerResult>,
        timeout: Option<Duration>,
    ) -> Ran {
        let deadline = timeout.map(|limit| Instant::now() + limit);
        let mut run = AssertUnwindSafe(run).catch_unwind();
        let finished = |result: std::thread::Result<HandlerResult>| result.unwrap_or_else(|p| Err(panicked(p)));
        // A handler that is done at its first poll needs no timer. (That poll has a no-op waker;
        // a pending handler is polled again at once below, with the real one.)
        if let Some(result) = (&mut run).now_or_never() {
            return Ran::Finished(finished(result));
        }
        tokio::select! {
            result = &mut run => Ran::Finished(finished(result)),
            () = self.keep_slots(attempt) => unreachable!("it never returns"),
            stop = self.keep_alive(attempt, held) => match stop {
                Stop::Lapsing => Ran::HoldLapsing,
                Stop::Cancelled => Ran::Stopped,
            },
            () = self.attempts.abandon.cancelled() => Ran::Abandoned,
            () = until(deadline) => Ran::TimedOut(timeout.unwrap_or_default()),
        }
    }

    /// Settles a job whose handler ran: how it ended, into the retry policy's decision.
    async fn conclude(&self, attempt: &Attempt<'_>, held: &Held, ran: Ran) {
        let kind = &attempt.claimed.job.kind;
        let result = match ran {
            Ran::Finished(result) => result,
            Ran::Abandoned => {
                self.release_hold(held).await;
                info!("interrupted by shutdown; released for another worker at no attempt's cost");
                self.counters.add_for(Count::Released, kind, 1);
                // Not charged: the job did not fail, the worker stopped. Charged, a job longer
                // than the grace would end as a record after `cap` deploys. The key stays
                // pending, so the next attempt knows it resumes.
                return self.settle("release", || async { self.hand_back(&attempt.lease()).await }).await;
            }
            Ran::Stopped => {
                self.release_hold(held).await;
                self.counters.add_for(Count::Stopped, kind, 1);
                // A retry, so that a backend that does not end the job cancelled charges the
                // attempt for it: the backend that answered `Cancelled` ends the job cancelled
                // instead, with its cancel's audit.
                let error = "cancelled while running: the handler was stopped";
                return self
                    .settle("cancel", || async { self.queue.retry(&attempt.lease(), Duration::ZERO, error).await })
                    .await;
            }
            Ran::HoldLapsing => {
                warn!("the key's hold could not be renewed: the handler was cancelled before it lapsed");
                self.counters.add_for(Count::Cancelled, kind, 1);
                Err(JobError::retry("cancelled: the key's hold could not be renewed before it lapsed"))
            }
            Ran::TimedOut(limit) => {
                warn!(timeout_ms = limit.as_millis() as u64, "the handler ran to its timeout and was cancelled");
                self.counters.add_for(Count::TimedOut, kind, 1);
                Err(JobError::retry(format!("timed out after {limit:?}")))
            }
        };
        let outcome = match (result, held.mode) {
            (Ok(value), HoldMode::Lease) => {
                self.breaker_after(&attempt.claimed.job, &Outcome::Done(Value::Null), attempt.probe()).await;
                // Done with its result in one fenced write, the one write that marks the effect
                // done: it must get through.
                debug!("done");
                self.counters.add_for(Count::Succeeded, kind, 1);
                return self
                    .settle("complete", || async { self.queue.complete(&attempt.lease(), Some(&value)).await })
                    .await;
            }
            (Ok(value), HoldMode::Ledger) => {
                let done = self.retrying("mark the effect done", || self.ledger.finish(&held.hold, &value)).await;
                if let Err(e) = done {
                    // The effect happened; a next delivery would see the key pending and resume.
                    tracing::error!(error = %e, "could not mark the effect done in the ledger");
                }
                Outcome::Done(value)
            }
            (Err(failed), _) => {
                self.release_hold(held).await;
                Outcome::from(failed)
            }
        };
        self.decide(attempt, outcome).await;
    }

    /// Carries out the retry policy's decision after a run.
    async fn decide(&self, attempt: &Attempt<'_>, outcome: Outcome) {
        let job = &attempt.claimed.job;
        // A failure while its kind's breaker holds the kind paused (this one may have tripped
        // it) is the provider's, not the job's: it waits for the probe, its attempt given back,
        // however old the job (the pause is listed and alerted: not unseen).
        let breaker_wait = self.breaker_after(job, &outcome, attempt.probe()).await;
        let age = (chrono::Utc::now() - job.enqueued_at).to_std().unwrap_or_default();
        let decision = match (breaker_wait, &outcome) {
            (Some(wait), Outcome::Retry { .. }) => Decision::DeferFor(wait),
            _ => self.attempts.policy.decide(job.attempt, job.cap, age, &outcome),
        };
        match decision {
            Decision::Complete => {
                debug!("done");
                self.counters.add_for(Count::Succeeded, &job.kind, 1);
                self.confirm_replay(job).await;
                self.settle("complete", || async { self.queue.complete(&attempt.lease(), None).await }).await;
            }
            Decision::RetryIn(delay) => {
                let error = error_of(&outcome);
                warn!(error, retry_in_ms = delay.as_millis() as u64, "attempt failed; retrying");
                self.counters.add_for(Count::Retried, &job.kind, 1);
                self.settle("retry", || async { self.queue.retry(&attempt.lease(), delay, error).await }).await;
            }
            Decision::DeferFor(delay) => {
                // The span names the job, its kind, attempt and key; the handler's reason is its
                // own words, never the payload.
                info!(
                    reason = error_of(&outcome),
                    retry_in_ms = delay.as_millis() as u64,
                    "not now: put back at no attempt's cost"
                );
                self.counters.add_for(Count::Deferred, &job.kind, 1);
                self.settle("defer", || async { self.queue.defer(&attempt.lease(), delay).await }).await;
            }
            Decision::DeadLetter => self.dead_letter(&attempt.claimed(), error_of(&outcome)).await,
        }
    }
}

fn error_of(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Done(_) => "",
        Outcome::Retry { error, .. } | Outcome::Fail { error } | Outcome::NotNow { error, .. } => error,
    }
}

/// Resolves at `at`, or never.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
