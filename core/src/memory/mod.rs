//! The in-memory backend: the reference for redrive's semantics and the embedded default.
//!
//! It implements every contract with real lease expiry and fencing, in one process, with
//! nothing persisted. Use it for tests, examples and single-process tools.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use self::ledger::{Effect, LedgerEntry};
use crate::backend::{
    AttemptError, Backend, Capabilities, Claim, Claimed, Counts, Enqueue, Enqueued, FailureId, FailureRecord, Kinds,
    Lease, QueueStats, RecordState, Renew,
};
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobRecord, NewJob};
use crate::key::IdempotencyKey;

mod flow;
mod jobs;
mod ledger;
mod records;
#[cfg(test)]
mod tests;

/// A queue, dead-letter store and effect ledger in memory. Clones share the same state.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    work: Arc<Notify>,
    max_payload: usize,
    ledger_retention: Duration,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    jobs: BTreeMap<u64, StoredJob>,
    by_key: HashMap<IdempotencyKey, u64>,
    next_record: u64,
    records: BTreeMap<u64, FailureRecord>,
    ledger: HashMap<IdempotencyKey, LedgerEntry>,
    /// When the ledger was last swept of done keys past their retention.
    ledger_swept: Option<Instant>,
    /// A job of a priority other than 0 was ever enqueued: claims then read every job, not only
    /// up to the batch's last.
    prioritised: bool,
    flow: flow::FlowState,
}

#[derive(Debug)]
struct StoredJob {
    job: NewJob,
    fingerprint: String,
    enqueued_at: chrono::DateTime<Utc>,
    attempts: u32,
    /// Whether the current claim's handler started (its lease was renewed).
    started: bool,
    /// Claims that lapsed before their handler started.
    stranded: u32,
    status: Status,
    errors: Vec<AttemptError>,
    /// When its status last changed (a renewal is not a change).
    updated_at: chrono::DateTime<Utc>,
    /// Set with `Status::Done` when it was cancelled unrun; with `Status::Running`, the cancel
    /// asked of it, which ends it cancelled at whatever settles it but a completion.
    cancelled: Option<crate::backend::Cancellation>,
}

impl StoredJob {
    /// The job as its current claim sees it (and its failure record keeps it).
    fn record(&self, id: u64) -> JobRecord {
        let job = &self.job;
        JobRecord {
            id: JobId(id.to_string()),
            kind: job.kind.clone(),
            key: job.key.clone(),
            provider_key: job.provider_key,
            payload: job.payload.clone(),
            attempt: self.attempts,
            cap: job.cap,
            severity: job.severity,
            priority: job.priority,
            enqueued_at: self.enqueued_at,
            deadline: job.deadline,
            // Held back until then by its ready time.
            not_before: None,
            stranded: self.stranded,
            undecodable: None,
            // Its records are found by its id here.
            replay_of: None,
            traceparent: job.traceparent.clone(),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Status {
    Queued { ready_at: Instant },
    Running { token: String, expires: Instant },
    Done,
    Failed,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// The payload limit unless set otherwise: 256 KiB, the smallest of the hosted queues'.
    pub const DEFAULT_MAX_PAYLOAD: usize = 256 * 1024;

    /// An empty backend.
    pub fn new() -> Self {
        Self::with_max_payload(Self::DEFAULT_MAX_PAYLOAD)
    }

    /// How long a done key of the effect ledger answers unless set otherwise: 24 hours, as Stripe
    /// keeps its idempotency keys.
    pub const DEFAULT_LEDGER_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

    /// An empty backend refusing payloads over `bytes`.
    pub fn with_max_payload(bytes: usize) -> Self {
        let (work, ledger_retention) = (Arc::new(Notify::new()), Self::DEFAULT_LEDGER_RETENTION);
        Self { state: Arc::default(), work, max_payload: bytes, ledger_retention }
    }

    /// Lets a done key of the effect ledger go `retention` after it was finished: a `begin` with
    /// it then starts afresh, and its stored result is forgotten, so a long-running process keeps
    /// a window of keys rather than all of them (what `prune_done` does for the databases). Set
    /// it on the backend before cloning it.
    pub fn with_ledger_retention(mut self, retention: Duration) -> Self {
        self.ledger_retention = retention;
        self
    }

    /// The payload limit in bytes.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent state (every mutation is one step).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `text` appears anywhere the backend keeps data: jobs' payloads, failure records,
    /// effect results. For tests that check a purge forgets what it should.
    pub fn holds_text(&self, text: &str) -> bool {
        let state = self.lock();
        let json = |v: &Value| v.to_string().contains(text);
        state.jobs.values().any(|j| json(&j.job.payload) || j.errors.iter().any(|e| e.error.contains(text)))
            || state.records.values().any(|r| json(&r.payload) || r.last_error.contains(text))
            || state.ledger.values().any(|e| matches!(&e.state, Effect::Done { result, .. } if json(result)))
    }

    /// The stored job behind a lease, if the lease is still its current one.
    fn fenced<'s>(state: &'s mut State, lease: &Lease) -> Result<&'s mut StoredJob> {
        let id = parse_id(&lease.job_id.0)?;
        match state.jobs.get_mut(&id) {
            Some(job) if matches!(&job.status, Status::Running { token, .. } if *token == lease.token) => Ok(job),
            Some(_) => Err(Error::new(ErrorKind::LeaseLost, format!("job {id} is no longer held by this lease"))),
            None => Err(Error::new(ErrorKind::NotFound, format!("job {id} does not exist"))),
        }
    }
}

fn parse_id(id: &str) -> Result<u64> {
    id.parse().map_err(|_| Error::new(ErrorKind::NotFound, format!("no job or record with id {id:?}")))
}

fn token() -> String {
    Uuid::new_v4().to_string()
}

impl State {
    fn enqueue(&mut self, job: NewJob) -> Result<Enqueued> {
        let fingerprint = job.fingerprint();
        if let Some(&id) = self.by_key.get(&job.key) {
            let existing = &self.jobs[&id];
            if existing.fingerprint != fingerprint {
                return Err(Error::new(
                    ErrorKind::KeyConflict,
                    format!("key {} already belongs to job {id} with a different payload", job.key),
                ));
            }
            if existing.status == Status::Failed {
                return Ok(Enqueued::Failed { id: JobId(id.to_string()) });
            }
            let provider_key = Some(existing.job.provider_key);
            return Ok(Enqueued::Duplicate { id: JobId(id.to_string()), provider_key });
        }
        self.next_id += 1;
        let id = self.next_id;
        self.prioritised |= job.priority != 0;
        self.by_key.insert(job.key.clone(), id);
        let wait = job.not_before.and_then(|at| (at - Utc::now()).to_std().ok()).unwrap_or_default();
        let status = Status::Queued { ready_at: Instant::now() + wait };
        let stored = StoredJob {
            job,
            fingerprint,
            enqueued_at: Utc::now(),
            attempts: 0,
            started: false,
            stranded: 0,
            status,
            errors: vec![],
            updated_at: Utc::now(),
            cancelled: None,
        };
        self.jobs.insert(id, stored);
        Ok(Enqueued::Created(JobId(id.to_string())))
    }

    /// Ends job `id` cancelled (unrun, or stopped while it ran), with the cancel it holds: done,
    /// its key kept, and the record it replays, if any, closed as discarded. Tells the workers
    /// when later jobs of its order key may now run.
    fn end_cancelled(&mut self, id: u64) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        let Some(cancel) = job.cancelled.clone() else { return false };
        job.status = Status::Done;
        job.updated_at = Utc::now();
        let ordered = job.job.order_key.is_some();
        let job_id = JobId(id.to_string());
        // A replayed job's record will never be settled by it: closed with the cancel.
        for record in self.records.values_mut().filter(|r| r.job_id == job_id) {
            if let RecordState::Replaying { .. } = record.state {
                record.state = RecordState::Discarded {
                    at: cancel.at,
                    reason: format!("its replayed job was cancelled: {}", cancel.reason),
                    actor: cancel.actor.clone(),
                };
            }
        }
        ordered
    }

    /// Claims ready jobs, highest priority first and oldest first within one, or says when the
    /// next one becomes ready.
    fn claim(&mut self, kinds: &Kinds, max: usize, lease: Duration, now: Instant) -> (Vec<Claimed>, Option<Instant>) {
        // Cancelled running jobs whose workers died with them, met on the way: ended cancelled
        // below, not run again.
        let mut lapsed_cancelled = Vec::new();
        let mut ready = Vec::new();
        let mut next_ready: Option<Instant> = None;
        // Order keys with an unfinished job seen so far: a later job of one waits (whatever its
        // kind), however ready it is. A failed job keeps its order key while its record is open.
        let mut ahead: HashSet<String> = HashSet::new();
        for (id, stored) in self.jobs.iter() {
            let waits = match &stored.job.order_key {
                Some(order) if stored.status != Status::Done => !ahead.insert(order.clone()),
                _ => false,
            };
            if waits || !kinds.wants(&stored.job.kind) {
                continue;
            }
            let ready_at = match &stored.status {
                Status::Queued { ready_at } => *ready_at,
                // An expired lease makes the job claimable again: the lazy form of a sweep.
                Status::Running { expires, .. } => *expires,
                Status::Done | Status::Failed => continue,
            };
            if ready_at > now {
                next_ready = Some(next_ready.map_or(ready_at, |n| n.min(ready_at)));
                continue;
            }
            if stored.cancelled.is_some() && matches!(stored.status, Status::Running { .. }) {
                lapsed_cancelled.push(*id);
                continue;
            }
            ready.push((std::cmp::Reverse(stored.job.priority), *id));
            if ready.len() == max && !self.prioritised {
                // All at 0: the first `max` in id order are the batch.
                break;
            }
        }
        for id in lapsed_cancelled {
            self.end_cancelled(id);
        }
        // Stable: within a priority, in id order, as without priorities.
        ready.sort_by_key(|(priority, _)| *priority);
        let mut claimed = Vec::new();
        for (_, id) in ready.into_iter().take(max) {
            let stored = self.jobs.get_mut(&id).expect("listed above");
            if matches!(stored.status, Status::Running { .. }) && !stored.started {
                // The lapsed claim never started its handler: its worker died with the job
                // claimed ahead. It costs the job nothing.
                stored.attempts -= 1;
                stored.stranded += 1;
            }
            stored.attempts += 1;
            stored.started = false;
            stored.updated_at = Utc::now();
            let token = token();
            stored.status = Status::Running { token: token.clone(), expires: now + lease };
            claimed.push(Claimed {
                job: stored.record(id),
                lease: Lease { job_id: JobId(id.to_string()), token },
                begun: None,
            });
        }
        (claimed, next_ready)
    }
}

impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_payload: self.max_payload,
            order_per_key: true,
            amend_replay: true,
            live_jobs: true,
            priorities: true,
            ..Capabilities::default()
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("redrive_memory")
    }
}

impl Enqueue for MemoryBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        job.check_fits(&self.capabilities())?;
        let result = self.lock().enqueue(job)?;
        self.work.notify_waiters();
        Ok(result)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            job.check_fits(&self.capabilities())?;
        }
        let results = {
            let mut state = self.lock();
            // All or nothing: find any key conflict before the first insert.
            let mut seen = HashMap::new();
            for job in &jobs {
                let fingerprint = job.fingerprint();
                let known = state.by_key.get(&job.key).map(|id| &state.jobs[id].fingerprint);
                let earlier = seen.insert(&job.key, fingerprint.clone());
                if known.is_some_and(|f| *f != fingerprint) || earlier.is_some_and(|f| f != fingerprint) {
                    return Err(Error::new(
                        ErrorKind::KeyConflict,
                        format!("key {} is used with two payloads", job.key),
                    ));
                }
            }
            jobs.into_iter().map(|job| state.enqueue(job)).collect::<Result<Vec<_>>>()?
        };
        self.work.notify_waiters();
        Ok(results)
    }
}

impl Claim for MemoryBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let deadline = Instant::now() + wait;
        loop {
            // Register for wake-ups before looking, so an enqueue in between is not missed.
            let notified = self.work.notified();
            let (claimed, next_ready) = self.lock().claim(kinds, max, lease, Instant::now());
            let now = Instant::now();
            if !claimed.is_empty() || now >= deadline {
                return Ok(claimed);
            }
            let until = next_ready.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, lease)?;
        job.status = Status::Done;
        job.updated_at = Utc::now();
        // Completion wins over a cancel asked of it: the effect is done, the job reads done.
        job.cancelled = None;
        if job.job.order_key.is_some() {
            // The next job of its order key may run now.
            self.work.notify_waiters();
        }
        // Done is the effect done (ran, or found done in the ledger): a replay of this job is
        // confirmed with it. Unless the key was cancelled in the ledger (a broker's cancel, met by
        // a worker that completes the job unrun): then the replay is withdrawn, and its record
        // discarded with the cancel.
        let key = job.job.key.clone();
        let withdrawn = match state.ledger.get(&key).map(|e| &e.state) {
            Some(ledger::Effect::Cancelled(cancel)) => Some(cancel.clone()),
            _ => None,
        };
        let now = Utc::now();
        for record in state.records.values_mut().filter(|r| r.job_id == lease.job_id) {
            let settled = match &withdrawn {
                Some(cancel) if matches!(record.state, RecordState::Replaying { .. }) => Some(RecordState::Discarded {
                    at: now,
                    reason: format!("its replayed job was cancelled: {}", cancel.reason),
                    actor: cancel.actor.clone(),
                }),
                Some(_) => None,
                None => record.state.confirmed(now),
            };
            if let Some(settled) = settled {
                record.state = settled;
            }
        }
        Ok(())
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let mut state = self.lock();
        if self.cancelled_at_settle(&mut state, lease)? {
            return Ok(());
        }
        let job = Self::fenced(&mut state, lease)?;
        job.errors.push(AttemptError { attempt: job.attempts, at: Utc::now(), error: error.to_owned() });
        job.status = Status::Queued { ready_at: Instant::now() + delay };
        job.updated_at = Utc::now();
        drop(state);
        self.work.notify_waiters();
        Ok(())
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.give_back(lease, delay)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.give_back(lease, Duration::ZERO)
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, &claimed.lease)?;
        let now = Utc::now();
        job.status = Status::Failed;
        job.updated_at = now;
        // A cancel asked while it ran is spent: the record is what a person sees, and its replay
        // must run.
        job.cancelled = None;
        job.errors.push(AttemptError { attempt: job.attempts, at: now, error: error.to_owned() });
        let errors = std::mem::take(&mut job.errors);
        let job = job.record(parse_id(&claimed.lease.job_id.0)?);
        state.next_record += 1;
        let id = FailureId(state.next_record.to_string());
        let mut record = FailureRecord::open(id.clone(), job, error.to_owned(), errors, now);
        // The failing attempt's trace, as the worker hands the job over (see `Claim::dead_letter`).
        record.trace_id = claimed.job.trace_id().map(str::to_owned);
        // A replay that failed again: the old record names the new one, and the new one it.
        for old in state.records.values_mut().filter(|r| r.job_id == record.job_id) {
            if let Some(failed_again) = old.state.failed_again(now, id.clone()) {
                old.state = failed_again;
                record.replay_of = Some(old.id.clone());
            }
        }
        let n = state.next_record;
        state.records.insert(n, record.clone());
        Ok(Some(record))
    }

    /// Never asked: its jobs carry no `replay_of`, their completion confirms the record.
    async fn confirm_replay(&self, _record: &FailureId) -> Result<()> {
        Ok(())
    }

    async fn withdraw_replay(&self, _record: &FailureId, _cancel: &crate::backend::Cancellation) -> Result<()> {
        Ok(())
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl MemoryBackend {
    /// Queued again after `delay`, the attempt given back: its handler never ran.
    fn give_back(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let mut state = self.lock();
        if self.cancelled_at_settle(&mut state, lease)? {
            return Ok(());
        }
        let job = Self::fenced(&mut state, lease)?;
        job.attempts -= 1;
        job.status = Status::Queued { ready_at: Instant::now() + delay };
        job.updated_at = Utc::now();
        drop(state);
        self.work.notify_waiters();
        Ok(())
    }
}

impl MemoryBackend {
    /// Ends the job of `lease` cancelled if a person cancelled it while it ran: what a retry or a
    /// give-back does instead of queueing it again. Whether it did.
    fn cancelled_at_settle(&self, state: &mut State, lease: &Lease) -> Result<bool> {
        if Self::fenced(state, lease)?.cancelled.is_none() {
            return Ok(false);
        }
        if state.end_cancelled(parse_id(&lease.job_id.0)?) {
            self.work.notify_waiters();
        }
        Ok(true)
    }
}

impl Renew for MemoryBackend {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, true)
    }

    async fn renew_settling(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, false)
    }
}

impl MemoryBackend {
    /// A renewal; refused for a job a person cancelled if `heed_cancel`.
    fn extend(&self, lease: &Lease, by: Duration, heed_cancel: bool) -> Result<Lease> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, lease)?;
        if heed_cancel && job.cancelled.is_some() {
            // Not renewed: the worker stops the handler and settles the job, which ends it.
            return Err(Error::new(ErrorKind::Cancelled, format!("job {} was cancelled while it ran", lease.job_id)));
        }
        job.started = true;
        if let Status::Running { expires, .. } = &mut job.status {
            *expires = Instant::now() + by;
        }
        Ok(lease.clone())
    }
}

impl QueueStats for MemoryBackend {
    async fn counts(&self) -> Result<Counts> {
        let now = Instant::now();
        let (mut counts, mut scheduled) = (Counts::default(), 0);
        for job in self.lock().jobs.values() {
            match job.status {
                Status::Queued { ready_at } if ready_at > now => {
                    counts.queued += 1;
                    scheduled += 1;
                }
                Status::Queued { ready_at } => {
                    counts.queued += 1;
                    let waited = now - ready_at;
                    counts.oldest_ready = Some(counts.oldest_ready.map_or(waited, |o| o.max(waited)));
                }
                Status::Running { .. } => counts.running += 1,
                Status::Done | Status::Failed => {}
            }
        }
        counts.scheduled = Some(scheduled);
        Ok(counts)
    }
}
