//! The in-memory backend: the reference for redrive's semantics and the embedded default.
//!
//! It implements every contract with real lease expiry and fencing, in one process, with
//! nothing persisted. Use it for tests, examples and single-process tools.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::backend::{
    AttemptError, Backend, Begin, Capabilities, Claim, Claimed, Counts, DeadLetter, Enqueue, Enqueued, FailureId,
    FailureQuery, FailureRecord, Hold, Kinds, Lease, Ledger, QueueStats, RecordState, Renew, Replay, ReplayOutcome,
    require_audit,
};
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobRecord, NewJob};
use crate::key::{IdempotencyKey, ProviderKey};

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
}

#[derive(Debug, PartialEq)]
enum Status {
    Queued { ready_at: Instant },
    Running { token: String, expires: Instant },
    Done,
    Failed,
}

#[derive(Debug)]
struct LedgerEntry {
    fingerprint: String,
    provider_key: ProviderKey,
    state: Effect,
}

#[derive(Debug)]
enum Effect {
    Pending { token: String, until: Instant },
    Done { result: Value, at: Instant },
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
    /// Forgets done ledger keys finished `retention` ago or more: `key` at once (so it never
    /// answers late), all of them at most once per sixteenth of the retention (so a sweep's cost
    /// is spread over many begins). Alert keys stay, as with Postgres's `prune_done`: while their
    /// record is open, a forgotten one would page again.
    fn expire_keys(&mut self, key: &IdempotencyKey, retention: Duration, now: Instant) {
        let expired = |key: &IdempotencyKey, e: &LedgerEntry| {
            matches!(e.state, Effect::Done { at, .. } if now.duration_since(at) >= retention)
                && !key.as_str().starts_with("redrive_alert:")
        };
        if self.ledger_swept.is_none_or(|swept| now.duration_since(swept) >= retention / 16) {
            self.ledger.retain(|key, e| !expired(key, e));
            self.ledger_swept = Some(now);
        } else if self.ledger.get(key).is_some_and(|e| expired(key, e)) {
            self.ledger.remove(key);
        }
    }

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
        };
        self.jobs.insert(id, stored);
        Ok(Enqueued::Created(JobId(id.to_string())))
    }

    /// Claims ready jobs, or says when the next one becomes ready.
    fn claim(&mut self, kinds: &Kinds, max: usize, lease: Duration, now: Instant) -> (Vec<Claimed>, Option<Instant>) {
        let mut claimed = Vec::new();
        let mut next_ready: Option<Instant> = None;
        for (id, stored) in self.jobs.iter_mut() {
            if !kinds.wants(&stored.job.kind) {
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
            if claimed.len() == max {
                break;
            }
            if matches!(stored.status, Status::Running { .. }) && !stored.started {
                // The lapsed claim never started its handler: its worker died with the job
                // claimed ahead. It costs the job nothing.
                stored.attempts -= 1;
                stored.stranded += 1;
            }
            stored.attempts += 1;
            stored.started = false;
            let token = token();
            stored.status = Status::Running { token: token.clone(), expires: now + lease };
            let job = &stored.job;
            claimed.push(Claimed {
                job: JobRecord {
                    id: JobId(id.to_string()),
                    kind: job.kind.clone(),
                    key: job.key.clone(),
                    provider_key: job.provider_key,
                    payload: job.payload.clone(),
                    attempt: stored.attempts,
                    cap: job.cap,
                    severity: job.severity,
                    enqueued_at: stored.enqueued_at,
                    deadline: job.deadline,
                    // Held back until then by its ready time.
                    not_before: None,
                    stranded: stored.stranded,
                    undecodable: None,
                },
                lease: Lease { job_id: JobId(id.to_string()), token },
                begun: None,
            });
        }
        (claimed, next_ready)
    }
}

impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities { max_payload: self.max_payload, ..Capabilities::default() }
    }
}

impl Enqueue for MemoryBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        job.check_size(self.max_payload)?;
        let result = self.lock().enqueue(job)?;
        self.work.notify_waiters();
        Ok(result)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            job.check_size(self.max_payload)?;
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
        Self::fenced(&mut self.lock(), lease)?.status = Status::Done;
        Ok(())
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, lease)?;
        job.errors.push(AttemptError { attempt: job.attempts, at: Utc::now(), error: error.to_owned() });
        job.status = Status::Queued { ready_at: Instant::now() + delay };
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
        job.errors.push(AttemptError { attempt: job.attempts, at: now, error: error.to_owned() });
        let errors = std::mem::take(&mut job.errors);
        let (attempts, new) = (job.attempts, job.job.clone());
        state.next_record += 1;
        let record = FailureRecord {
            id: FailureId(state.next_record.to_string()),
            job_id: claimed.lease.job_id.clone(),
            kind: new.kind,
            key: new.key,
            provider_key: new.provider_key,
            payload: new.payload,
            last_error: error.to_owned(),
            first_failed_at: errors.first().map_or(now, |e| e.at),
            errors,
            attempts,
            cap: new.cap,
            severity: new.severity,
            last_failed_at: now,
            state: RecordState::Open,
        };
        let n = state.next_record;
        state.records.insert(n, record.clone());
        Ok(Some(record))
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl MemoryBackend {
    /// Queued again after `delay`, the attempt given back: its handler never ran.
    fn give_back(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, lease)?;
        job.attempts -= 1;
        job.status = Status::Queued { ready_at: Instant::now() + delay };
        drop(state);
        self.work.notify_waiters();
        Ok(())
    }
}

impl Renew for MemoryBackend {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        let mut state = self.lock();
        let job = Self::fenced(&mut state, lease)?;
        job.started = true;
        if let Status::Running { expires, .. } = &mut job.status {
            *expires = Instant::now() + by;
        }
        Ok(lease.clone())
    }
}

impl DeadLetter for MemoryBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let after = query.after.as_ref().map(|id| parse_id(&id.0)).transpose()?.unwrap_or(0);
        let state = self.lock();
        let page = state.records.range(after + 1..).map(|(_, r)| r).filter(|r| query.matches(r));
        Ok(page.take(query.page_size()).cloned().collect())
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let n = parse_id(&id.0)?;
        self.lock()
            .records
            .get(&n)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))
    }

    async fn count_open(&self) -> Result<u64> {
        Ok(self.lock().records.values().filter(|r| r.state.is_open()).count() as u64)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let n = parse_id(&id.0)?;
        let mut state = self.lock();
        let record = state
            .records
            .get_mut(&n)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        if record.state.is_open() {
            record.state =
                RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        let horizon = Utc::now() - age;
        let mut state = self.lock();
        let purged: Vec<FailureRecord> = {
            let old: Vec<u64> =
                state.records.iter().filter(|(_, r)| r.last_failed_at < horizon).map(|(n, _)| *n).collect();
            old.iter().filter_map(|n| state.records.remove(n)).collect()
        };
        // A failed job goes with its last record, payload, key and ledger entry: the key is free
        // again. A job with a newer record (failed again after a replay) stays for it.
        for record in &purged {
            let Ok(id) = parse_id(&record.job_id.0) else { continue };
            let recorded = state.records.values().any(|r| r.job_id == record.job_id);
            if !recorded && state.jobs.get(&id).is_some_and(|j| j.status == Status::Failed) {
                let job = state.jobs.remove(&id).expect("looked up above");
                state.by_key.remove(&job.job.key);
                state.ledger.remove(&job.job.key);
            }
        }
        Ok(purged.len() as u64)
    }
}

impl Replay for MemoryBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        let n = parse_id(&id.0)?;
        let mut state = self.lock();
        let record =
            state.records.get(&n).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state.clone()));
        }
        let job_id = record.job_id.clone();
        // Reset the existing job: a fresh enqueue with the same key would only find a duplicate.
        let job = state
            .jobs
            .get_mut(&parse_id(&job_id.0)?)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "the record's job is gone"))?;
        job.attempts = 0;
        job.errors.clear();
        // A person asked for it to run: its deadline, if it had one, no longer applies.
        job.job.deadline = None;
        job.status = Status::Queued { ready_at: Instant::now() };
        state.records.get_mut(&n).expect("looked up above").state =
            RecordState::Replayed { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        drop(state);
        self.work.notify_waiters();
        Ok(ReplayOutcome::Replayed(job_id))
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

impl Ledger for MemoryBackend {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let fingerprint = &crate::job::payload_fingerprint(payload);
        let now = Instant::now();
        let mut state = self.lock();
        state.expire_keys(key, self.ledger_retention, now);
        let Some(entry) = state.ledger.get_mut(key) else {
            let token = token();
            let pending = Effect::Pending { token: token.clone(), until: now + hold };
            let entry = LedgerEntry { fingerprint: fingerprint.to_owned(), provider_key, state: pending };
            state.ledger.insert(key.clone(), entry);
            return Ok(Begin::Fresh(Hold { key: key.clone(), token, provider_key, lease: None }));
        };
        if entry.fingerprint != *fingerprint {
            return Err(Error::new(ErrorKind::KeyConflict, format!("key {key} was used with a different payload")));
        }
        match &mut entry.state {
            Effect::Done { result, .. } => Ok(Begin::Done(result.clone())),
            Effect::Pending { until, .. } if *until > now => Ok(Begin::Busy(*until - now)),
            Effect::Pending { token: held, until } => {
                *held = token();
                *until = now + hold;
                let hold =
                    Hold { key: key.clone(), token: held.clone(), provider_key: entry.provider_key, lease: None };
                Ok(Begin::Resumed(hold))
            }
        }
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        match self.lock().ledger.get_mut(&hold.key).map(|e| &mut e.state) {
            Some(Effect::Pending { token, until }) if *token == hold.token => {
                *until = Instant::now() + by;
                Ok(())
            }
            _ => Err(Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held by this attempt", hold.key))),
        }
    }

    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        if let Some(Effect::Pending { token, until }) = self.lock().ledger.get_mut(&hold.key).map(|e| &mut e.state)
            && *token == hold.token
        {
            *until = Instant::now();
        }
        Ok(())
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        if let Some(entry) = self.lock().ledger.get_mut(&hold.key)
            && !matches!(entry.state, Effect::Done { .. })
        {
            entry.state = Effect::Done { result: result.clone(), at: Instant::now() };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(n: u32) -> NewJob {
        let key = IdempotencyKey::builder("t").fact("n", n).build().unwrap();
        NewJob::new("t", key, json!({"n": n})).unwrap()
    }

    const LEASE: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn enqueue_dedupes_by_key_and_refuses_a_changed_payload() {
        let b = MemoryBackend::new();
        let original = job(1);
        let first = b.enqueue(original.clone()).await.unwrap();
        assert!(first.is_created());
        let again = job(1);
        assert_ne!(again.provider_key, original.provider_key, "each NewJob mints its own");
        let stored = Some(original.provider_key);
        assert_eq!(
            b.enqueue(again).await.unwrap(),
            Enqueued::Duplicate { id: first.id().clone(), provider_key: stored }
        );
        let mut changed = job(1);
        changed.payload = json!({"n": 2});
        assert_eq!(b.enqueue(changed).await.unwrap_err().kind(), ErrorKind::KeyConflict);
        assert_eq!(b.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_expired_lease_is_fenced_after_a_new_claim() {
        let b = MemoryBackend::new();
        b.enqueue(job(1)).await.unwrap();
        let stale = b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().remove(0);
        b.renew(&stale.lease, LEASE).await.unwrap(); // its handler started
        assert!(b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().is_empty(), "held while the lease runs");
        let fresh = b.claim(&Kinds::Any, 1, LEASE, LEASE * 4).await.unwrap().remove(0);
        assert_eq!(fresh.job.attempt, 2, "attempts are counted at claim");
        for err in [
            b.complete(&stale.lease, None).await.unwrap_err(),
            b.retry(&stale.lease, Duration::ZERO, "x").await.unwrap_err(),
            b.renew(&stale.lease, LEASE).await.unwrap_err(),
            b.dead_letter(&stale, "x").await.unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::LeaseLost);
        }
        b.complete(&fresh.lease, None).await.unwrap();
        assert_eq!(b.count_open().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_claim_that_lapses_before_its_handler_started_costs_no_attempt() {
        let b = MemoryBackend::new();
        b.enqueue(job(1)).await.unwrap();
        let stranded = b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().remove(0);
        assert_eq!((stranded.job.attempt, stranded.job.stranded), (1, 0));
        let again = b.claim(&Kinds::Any, 1, LEASE, LEASE * 4).await.unwrap().remove(0);
        assert_eq!((again.job.attempt, again.job.stranded), (1, 1), "refunded, and counted as stranded");
        b.defer(&again.lease, Duration::ZERO).await.unwrap();
        let deferred = b.claim(&Kinds::Any, 1, LEASE, LEASE).await.unwrap().remove(0);
        assert_eq!(deferred.job.attempt, 1, "a deferral costs no attempt");
    }

    #[tokio::test]
    async fn claim_waits_for_an_enqueue() {
        let b = MemoryBackend::new();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.claim(&Kinds::Any, 1, LEASE, Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        b.enqueue(job(1)).await.unwrap();
        assert_eq!(waiter.await.unwrap().unwrap().len(), 1);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn ledger_gives_one_fresh_then_busy_resumed_and_done() {
        let b = MemoryBackend::new();
        let key = job(1).key;
        let (f, other) = (json!({"n": 1}), json!({"n": 2}));
        let pk = ProviderKey::mint();
        let Begin::Fresh(hold) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("first is fresh") };
        assert!(matches!(b.begin(&key, &f, pk, LEASE).await.unwrap(), Begin::Busy(_)));
        assert_eq!(b.begin(&key, &other, pk, LEASE).await.unwrap_err().kind(), ErrorKind::KeyConflict);
        b.release_hold(&hold).await.unwrap();
        let Begin::Resumed(again) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("released is resumed") };
        assert_eq!(b.extend_hold(&hold, LEASE).await.unwrap_err().kind(), ErrorKind::LeaseLost);
        b.finish(&again, &json!({"sent": true})).await.unwrap();
        assert_eq!(b.begin(&key, &f, pk, LEASE).await.unwrap(), Begin::Done(json!({"sent": true})));
    }

    #[tokio::test]
    async fn the_ledger_lets_done_keys_go_after_its_retention() {
        let retention = Duration::from_millis(200);
        let b = MemoryBackend::new().with_ledger_retention(retention);
        let (f, pk) = (json!({"n": 1}), ProviderKey::mint());
        let key = |n: u32| job(n).key;
        let alert = IdempotencyKey::builder("redrive_alert").fact("record", 1).fact("sink", 0).build().unwrap();
        for key in [key(1), key(2), alert.clone()] {
            let Begin::Fresh(hold) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("fresh") };
            b.finish(&hold, &json!({"answer": format!("answer-{key}")})).await.unwrap();
        }
        let finished = Instant::now();
        assert!(matches!(b.begin(&key(1), &f, pk, LEASE).await.unwrap(), Begin::Done(_)), "kept within it");
        tokio::time::sleep_until(finished + retention).await;
        b.begin(&key(3), &f, pk, LEASE).await.unwrap();
        let (first, second) = (format!("answer-{}", key(1)), format!("answer-{}", key(2)));
        assert!(!b.holds_text(&first) && !b.holds_text(&second), "let go, asked for again or not");
        assert!(matches!(b.begin(&key(1), &f, pk, LEASE).await.unwrap(), Begin::Fresh(_)), "a new effect after it");
        assert!(matches!(b.begin(&alert, &f, pk, LEASE).await.unwrap(), Begin::Done(_)), "an alert key stays");
        assert_eq!(MemoryBackend::new().ledger_retention, Duration::from_secs(24 * 3600), "Stripe's 24 hours");
    }

    #[tokio::test]
    async fn oversized_batches_send_nothing() {
        let b = MemoryBackend::with_max_payload(4);
        let err = b.enqueue_batch(vec![job(1), job(2)]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PayloadTooLarge);
        assert!(b.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap().is_empty());
    }
}
