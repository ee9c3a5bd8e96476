//! Flow control's mechanics in the worker: the kinds' pauses and limits as the store last said
//! (read once a `poll`), the gate a job passes before its key's hold (a paused kind, a breaker's
//! probe, concurrency slots, rate tokens), and the circuit breakers. Whether a job then runs or
//! waits is admission's answer (`admission.rs`, the [`Gate`] it reads); this file takes and
//! gives back what the gate holds.
//!
//! The store is the ledger's ([`Ledger::flow`]): shared by every worker on that database. A
//! ledger without one leaves the worker a store in memory, for this process alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Shared;
use super::attempt::Attempt;
use super::handler::Erased;
use super::permits::Permits;
use crate::alert::PauseAlert;
use crate::backend::{BREAKER, Claim, DeadLetter, Flow, KindFlow, Kinds, Ledger, Slot};
use crate::error::Result;
use crate::job::JobRecord;
use crate::memory::MemoryBackend;
use crate::policy::Outcome;

/// A circuit breaker for a job kind: after `after` retryable failures of the kind in a row (each
/// worker counts its own), the kind pauses itself in the flow store, for every worker, and one alert says
/// so ([`AlertSink::paused`](crate::AlertSink::paused)). Its jobs then wait at no attempt's cost
/// — the one whose failure tripped it and those failing beside it get that attempt back — and a
/// probe job is let through every `cool_down` (half-open): its success resumes the kind, its
/// failure keeps it paused. Off unless set ([`WorkerBuilder::breaker`](crate::WorkerBuilder::breaker)):
/// it stops a whole kind, which is right for a kind whose jobs share one provider and wrong where
/// each job fails for its own reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Retryable failures in a row that pause the kind (default 5).
    pub after: u32,
    /// How long the kind stays paused before a probe job runs, and between probes (default 30 s).
    pub cool_down: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Self { after: 5, cool_down: Duration::from_secs(30) }
    }
}

/// What flow control says of one job, asked before its key's hold.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Gate {
    /// Nothing holds it back; the slots it needed are taken.
    Open,
    /// Its kind's breaker is half-open, and this job is its probe.
    Probe,
    /// Its kind is paused: look again after this long.
    Paused {
        /// Who paused it.
        by: String,
        recheck: Duration,
    },
    /// Its kind's or its key's rate is spent until then.
    RateLimited(Duration),
    /// Its kind's (or its key's) concurrency limit is full.
    AtLimit,
    /// The flow store could not be reached.
    Unreachable {
        /// Failures in a row, this one included.
        failures: u32,
        error: String,
    },
}

/// The kinds' flow as the store last said, and the breakers' counts.
pub(super) struct Flowing {
    /// The store when the ledger keeps none: this process only.
    local: MemoryBackend,
    kinds: Mutex<Known>,
    /// One refresh at a time; the others read what is known.
    refreshing: tokio::sync::Mutex<()>,
    /// How stale what is known may get.
    every: Duration,
    breakers: HashMap<String, Breaker>,
    /// Retryable failures in a row, by kind.
    failing: Mutex<HashMap<String, u32>>,
    /// The slots and tokens this worker holds between jobs.
    permits: Permits,
    /// Set once the claims have stopped.
    stopping: AtomicBool,
}

#[derive(Default)]
struct Known {
    kinds: HashMap<String, Arc<KindFlow>>,
    at: Option<Instant>,
}

/// Runs one call on the ledger's flow store, or on the worker's own where it has none.
macro_rules! on_flow {
    ($shared:expr, $f:ident => $call:expr) => {
        match $shared.ledger.flow() {
            Some($f) => $call.await,
            None => {
                let $f = &$shared.flowing.local;
                $call.await
            }
        }
    };
}

impl Flowing {
    /// `every`: how stale the kinds' flow may get (the poll); `lease`: how long a slot is held.
    pub(super) fn new(breakers: HashMap<String, Breaker>, every: Duration, lease: Duration) -> Self {
        // Idle a quarter poll, a slot goes back: long enough for the next job of its key in a
        // burn-down, short enough that a worker out of work does not keep it from the others.
        let linger = (every / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        Self {
            local: MemoryBackend::new(),
            kinds: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
            every,
            breakers,
            failing: Mutex::default(),
            permits: Permits::new(linger, lease / 3),
            stopping: AtomicBool::new(false),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.kinds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the store last said of `kind`, if it is paused or limited.
    pub(super) fn kind(&self, kind: &str) -> Option<Arc<KindFlow>> {
        self.known().kinds.get(kind).cloned()
    }

    /// Whether jobs of `kind` pass the gate: the kind is paused or limited.
    pub(super) fn ruled(&self, kind: &str) -> bool {
        self.known().kinds.contains_key(kind)
    }

    /// The kinds to claim: `handled`, less those paused with no probe due. `None`: all of them.
    pub(super) fn claimable(&self, handled: &Kinds) -> Option<Kinds> {
        let known = self.known();
        let now = Utc::now();
        let Kinds::Only(kinds) = handled else { return None };
        let waiting = |kind: &String| {
            known.kinds.get(kind).and_then(|k| k.paused.as_ref()).is_some_and(|p| p.probe_at.is_none_or(|at| at > now))
        };
        kinds.iter().any(waiting).then(|| Kinds::Only(kinds.iter().filter(|k| !waiting(k)).cloned().collect()))
    }
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// Reads the kinds' flow from the store if what is known is older than a poll. A store that
    /// cannot be read leaves what was known (and the gate finds the store down).
    pub(super) async fn refresh_flow(&self) {
        let flowing = &self.flowing;
        if flowing.known().at.is_some_and(|at| at.elapsed() < flowing.every) {
            return;
        }
        // One look at a time; the others wait for it and read what it found.
        let _one = flowing.refreshing.lock().await;
        if flowing.known().at.is_some_and(|at| at.elapsed() < flowing.every) {
            return;
        }
        match on_flow!(self, f => f.kinds()) {
            Ok(kinds) => {
                // A paused kind's run of failures is over: the pause answered it, and after the
                // resume a new run starts from none.
                let mut failing = flowing.failing.lock().unwrap_or_else(|p| p.into_inner());
                failing.retain(|kind, _| !kinds.iter().any(|k| k.kind == *kind && k.paused.is_some()));
                drop(failing);
                let kinds = kinds.into_iter().map(|k| (k.kind.clone(), Arc::new(k))).collect();
                *flowing.known() = Known { kinds, at: Some(Instant::now()) };
            }
            Err(e) => {
                warn!(error = %e, "cannot read the kinds' pauses and limits; keeping what was known");
                flowing.known().at = Some(Instant::now());
            }
        }
    }

    /// Passes a job through the gate, taking the slots its limits need into `attempt`.
    pub(super) async fn gate(&self, attempt: &Attempt<'_>, handler: Option<&dyn Erased>) -> Gate {
        let job = &attempt.claimed.job;
        let Some(flow) = self.flowing.kind(&job.kind) else { return Gate::Open };
        match self.pass(attempt, &flow, handler).await {
            Ok(gate) => {
                if gate != Gate::Open && gate != Gate::Probe {
                    self.hand_in_slots(attempt);
                }
                gate
            }
            Err(e) => {
                self.hand_in_slots(attempt);
                Gate::Unreachable { failures: self.claiming.ledger_failed(), error: e.to_string() }
            }
        }
    }

    async fn pass(&self, attempt: &Attempt<'_>, flow: &KindFlow, handler: Option<&dyn Erased>) -> Result<Gate> {
        let job = &attempt.claimed.job;
        let kind = &job.kind;
        let recheck = self.config.poll * 5;
        let waiting = |by: &str, until: Duration| Gate::Paused { by: by.to_owned(), recheck: until.min(recheck) };
        // A breaker's pause whose probe is due: this job may be the probe, once it has the
        // slots and tokens its limits want (taken first, so that a probe is not spent on a job
        // that then waits for them).
        let mut probing = None;
        if let Some(paused) = &flow.paused {
            let now = Utc::now();
            match paused.probe_at {
                None => return Ok(waiting(&paused.by, recheck)),
                Some(at) if at > now => return Ok(waiting(&paused.by, (at - now).to_std().unwrap_or_default())),
                Some(_) => probing = Some(paused),
            }
        }
        let limits = flow.limits;
        let limit_key = match handler {
            Some(handler) if limits.key_concurrency.is_some() || limits.key_rate.is_some() => {
                handler.limit_key(&job.payload)
            }
            _ => None,
        };
        let kind_key = format!("kind:{kind}");
        let key_key = limit_key.map(|key| format!("key:{kind}:{key}"));
        let key_key = key_key.as_deref();
        let slots = [(limits.concurrency, Some(kind_key.as_str())), (limits.key_concurrency, key_key)];
        let slots = slots.into_iter().filter_map(|(n, key)| Some((key?, n?)));
        let permits = &self.flowing.permits;
        for (key, n) in slots {
            // A slot this worker holds idle serves at once; else one from the store.
            let slot = match permits.lend(key, n) {
                Some(slot) => slot,
                None => match on_flow!(self, f => f.take_slot(key, n, self.config.lease))? {
                    Some(slot) => {
                        permits.adopt(slot.clone());
                        slot
                    }
                    None => return Ok(Gate::AtLimit),
                },
            };
            attempt.slots().push(slot);
        }
        let rates = [(limits.rate, Some(kind_key.as_str())), (limits.key_rate, key_key)];
        for (key, rate) in rates.into_iter().filter_map(|(rate, key)| Some((key?, rate?))) {
            if permits.spend(key) {
                continue;
            }
            let tokens = on_flow!(self, f => f.take_tokens(key, rate, Permits::want(rate)))?;
            if tokens.granted == 0 {
                return Ok(Gate::RateLimited(tokens.wait));
            }
            permits.stock(key, tokens.granted - 1);
        }
        let Some(paused) = probing else { return Ok(Gate::Open) };
        let cool_down = self.flowing.breakers.get(kind).copied().unwrap_or_default().cool_down;
        if !on_flow!(self, f => f.take_probe(kind, cool_down))? {
            return Ok(waiting(&paused.by, cool_down));
        }
        info!("the kind's breaker is half-open: this job is its probe");
        Ok(Gate::Probe)
    }

    /// Keeps the attempt's slots once the claims have stopped, for as long as its handler runs
    /// through the shutdown's grace: until then the worker's sweep renews every slot it holds.
    /// Never returns.
    pub(super) async fn keep_slots(&self, attempt: &Attempt<'_>) {
        if attempt.slots().is_empty() {
            return std::future::pending().await;
        }
        let lease = self.config.lease;
        loop {
            tokio::time::sleep(lease / 3).await;
            if !self.flowing.stopping.load(Ordering::Relaxed) {
                continue;
            }
            let slots = attempt.slots().clone();
            for slot in &slots {
                self.renew_slot(slot).await;
            }
        }
    }

    async fn renew_slot(&self, slot: &Slot) {
        match on_flow!(self, f => f.renew_slot(slot, self.config.lease)) {
            Ok(true) => {}
            Ok(false) => {
                warn!(limit = %slot.key, "a concurrency slot lapsed and was taken over; letting it go");
                self.flowing.permits.forget(slot);
            }
            Err(e) => warn!(limit = %slot.key, error = %e, "cannot renew a concurrency slot"),
        }
    }

    /// The attempt's handler returned: its slots stay with this worker, idle, for the next job of
    /// their key. A limit counts handlers running, not settlements on their way.
    pub(super) fn hand_in_slots(&self, attempt: &Attempt<'_>) {
        let slots = std::mem::take(&mut *attempt.slots());
        for slot in &slots {
            self.flowing.permits.give_back(slot);
        }
    }

    /// The attempt is over: any slots it still has stay with this worker, idle, for the next job
    /// of their key; a stopping worker, whose sweep has ended, gives them back to the store at once.
    pub(super) async fn release_slots(&self, attempt: &Attempt<'_>) {
        self.hand_in_slots(attempt);
        if self.flowing.stopping.load(Ordering::Relaxed) {
            self.sweep_slots(true).await;
        }
    }

    /// Gives back to the store the slots idle here past the linger (all idle ones when `all`),
    /// and renews the held ones due.
    pub(super) async fn sweep_slots(&self, all: bool) {
        let sweep = self.flowing.permits.sweep(all);
        for slot in &sweep.release {
            if let Err(e) = on_flow!(self, f => f.release_slot(slot)) {
                // It lapses with its lease.
                warn!(limit = %slot.key, error = %e, "cannot release a concurrency slot");
            }
        }
        for slot in &sweep.renew {
            self.renew_slot(slot).await;
        }
    }

    /// Sweeps the slots held here while the worker runs, whether or not it claims (its handlers
    /// may all be busy with other kinds): an idle slot goes back within its linger, and a held
    /// one is renewed in time.
    pub(super) async fn keep_sweeping(&self, stop: &tokio_util::sync::CancellationToken) {
        let every = self.flowing.permits.sweep_every().max(Duration::from_millis(5));
        while !stop.is_cancelled() {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            // Also when no slot is held: spent tokens' keys are forgotten.
            self.sweep_slots(false).await;
        }
    }

    /// The claims have stopped: no job will want the slots held idle here.
    pub(super) async fn stop_flow(&self) {
        self.flowing.stopping.store(true, Ordering::Relaxed);
        self.sweep_slots(true).await;
    }

    /// Counts a run's outcome for its kind's breaker, tripping or closing it. Answers how long
    /// until the kind's next probe when its breaker holds it paused now: the job then waits that
    /// long without spending an attempt.
    pub(super) async fn breaker_after(&self, job: &JobRecord, outcome: &Outcome, probe: bool) -> Option<Duration> {
        let kind = &job.kind;
        let breaker = self.flowing.breakers.get(kind).copied();
        let failed = match outcome {
            Outcome::Retry { error, .. } => Some(error.as_str()),
            Outcome::Done(_) => None,
            // Its own fault (a permanent failure) or its own wish (not now): not the provider's.
            Outcome::Fail { .. } | Outcome::NotNow { .. } => return None,
        };
        let Some(error) = failed else {
            self.flowing.failing.lock().unwrap_or_else(|p| p.into_inner()).remove(kind);
            if probe {
                match on_flow!(self, f => f.close_breaker(kind)) {
                    Ok(true) => info!("the breaker's probe succeeded: the kind resumes"),
                    Ok(false) => {}
                    Err(e) => warn!(error = %e, "the probe succeeded but the kind could not be resumed"),
                }
                self.forget_flow();
            }
            return None;
        };
        if job.attempt >= job.cap && breaker.is_some() {
            // Its last attempt: another worker's breaker may have tripped since this one last
            // looked, and a record now is what the breaker is there to spare. Look again.
            self.forget_flow();
            self.refresh_flow().await;
        }
        // Paused by a breaker (another worker's, maybe one with no breaker set here): the
        // provider's failure, not the job's. It waits for the next probe, its attempt given back.
        let cool_down = breaker.unwrap_or_default().cool_down;
        let paused = self.flowing.kind(kind).and_then(|k| k.paused.clone());
        if let Some(paused) = paused.filter(|p| p.by == BREAKER || probe) {
            self.flowing.failing.lock().unwrap_or_else(|p| p.into_inner()).remove(kind);
            let next = paused.probe_at.and_then(|at| (at - Utc::now()).to_std().ok());
            return Some(next.unwrap_or(cool_down).max(Duration::from_millis(100)));
        }
        let breaker = breaker?;
        let failures = {
            let mut failing = self.flowing.failing.lock().unwrap_or_else(|p| p.into_inner());
            let n = failing.entry(kind.to_owned()).or_default();
            *n += 1;
            *n
        };
        if failures < breaker.after {
            return None;
        }
        // A new run of failures starts from here, whoever's pause stands.
        self.flowing.failing.lock().unwrap_or_else(|p| p.into_inner()).remove(kind);
        let reason = format!("{failures} failures in a row; last: {error}");
        match on_flow!(self, f => f.pause(kind, &reason, BREAKER, Some(breaker.cool_down))) {
            Ok(true) => {
                warn!(failures, "circuit breaker tripped: the kind is paused for every worker");
                let alert = PauseAlert {
                    kind: kind.to_owned(),
                    failures,
                    last_error: error.to_owned(),
                    probe_every: breaker.cool_down,
                    raised_at: Utc::now(),
                };
                self.announce_pause(&alert).await;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "the breaker could not pause the kind");
                return None;
            }
        }
        self.forget_flow();
        Some(breaker.cool_down)
    }

    /// Sends a breaker's alert to every sink, each tried a few times with backoff. Not through the
    /// ledger as a record's alert is: one worker's pause stands, so one worker sends it, and the
    /// pause itself stays listed (`redrive kind list`, the dashboard) if every try fails.
    async fn announce_pause(&self, alert: &PauseAlert) {
        let backoff = crate::policy::Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
            ..crate::policy::Backoff::default()
        };
        for sink in &self.alerting.sinks {
            for attempt in 1..=4 {
                match sink.paused(alert).await {
                    Ok(()) => break,
                    Err(e) if attempt < 4 => {
                        warn!(error = %e, attempt, "the breaker's alert was not delivered; trying again");
                        tokio::time::sleep(backoff.delay(attempt)).await;
                    }
                    Err(e) => warn!(error = %e, "the breaker's alert was not delivered; the pause stays listed"),
                }
            }
        }
    }

    /// Makes the next look read the store again (a pause or resume just made here).
    fn forget_flow(&self) {
        self.flowing.known().at = None;
    }
}
