//! The contracts a backend implements: small traits over primitives, native `async fn`.
//!
//! | trait | what it does |
//! |---|---|
//! | [`Backend`] | declares the backend's [`Capabilities`]; the worker and the suite read them |
//! | [`Enqueue`] | add jobs; created or duplicate; same key with another payload is a conflict |
//! | [`Claim`] | take jobs of some kinds under a lease; complete, retry, defer, release or dead-letter with it |
//! | [`Renew`] | optional: extend a lease, getting the lease to use from then on |
//! | [`DeadLetter`] | read and manage failure records |
//! | [`Replay`] | put a failure record's job back with its original keys |
//! | [`Ledger`] | the effect ledger: fresh / pending / done per key, with the key's provider key |
//! | [`QueueStats`] | how many jobs are queued and running |
//!
//! Conveniences (typed jobs, replay by filter, waiting for a queue to drain) live in
//! [`EnqueueExt`], [`ReplayExt`] and [`QueueStatsExt`].
//!
//! # Attempts
//!
//! An attempt is a handler start. A backend counts one at claim, and gives it back where it can
//! when the handler never started: [`Claim::defer`] always does, [`Claim::release`] and the
//! return of a lapsed claim where [`Capabilities`] say so.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::job::{Job, JobId, JobRecord, NewJob, Severity};
use crate::key::{IdempotencyKey, ProviderKey};
use crate::redact::debug_redacted;

/// How a backend treats the same key enqueued twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// Both copies are delivered; the effect ledger keeps the effect to one (SQS standard, Azure).
    None,
    /// Within this window after the first, a second copy with the same payload is dropped (SQS
    /// FIFO: 5 minutes; QStash); a copy with another payload is delivered, and the effect ledger
    /// turns it into a key-conflict record.
    Window(Duration),
    /// For as long as the first job is kept: a second copy answers
    /// [`Enqueued::Duplicate`] (Postgres, memory).
    Kept,
}

/// What a backend can do, declared through the contract so that the worker and the conformance
/// suite read it rather than have it restated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// What enqueuing a key twice does.
    pub dedupe: Dedupe,
    /// The largest payload accepted, in bytes; one more is refused with
    /// [`PayloadTooLarge`](crate::ErrorKind::PayloadTooLarge) before anything is sent.
    pub max_payload: usize,
    /// The most jobs one claim returns (SQS: 10); the worker asks for no more.
    pub max_claim: usize,
    /// A batch enqueue stores all of its jobs or none.
    pub atomic_batch: bool,
    /// [`Claim::release`] gives the attempt back (a queue that counts receives cannot).
    pub release_refunds: bool,
    /// A claim that lapses before its handler started gives the attempt back when the job returns
    /// (see [`JobRecord::stranded`](crate::JobRecord::stranded)); otherwise a crash charges every
    /// job its worker had claimed.
    pub crash_refunds: bool,
    /// [`Claim::claim`] takes only the kinds asked for. Otherwise the worker hands back, by
    /// [`Claim::defer`], the jobs of kinds it has no handler for.
    pub claim_by_kind: bool,
    /// The shortest lease the backend honours (SQS: 1 s).
    pub min_lease: Duration,
    /// Deliveries are pushed to the application (QStash) rather than claimed.
    pub push_delivery: bool,
    /// The longest delay the backend holds a scheduled job back by itself
    /// ([`NewJob::not_before`]); `None`: none. A job claimed before its time (past this cap, or
    /// on a backend without one) is put back by the worker until then, at no attempt's cost.
    pub max_delay: Option<Duration>,
}

impl Default for Capabilities {
    /// What the in-memory backend can do: everything, at 256 KiB.
    fn default() -> Self {
        Self {
            dedupe: Dedupe::Kept,
            max_payload: 256 * 1024,
            max_claim: usize::MAX,
            atomic_batch: true,
            release_refunds: true,
            crash_refunds: true,
            claim_by_kind: true,
            min_lease: Duration::from_millis(1),
            push_delivery: false,
            max_delay: Some(Duration::MAX),
        }
    }
}

/// Declares what a backend can do.
pub trait Backend: Send + Sync {
    /// The backend's capabilities; the same answer every time.
    fn capabilities(&self) -> Capabilities;
}

/// What [`Enqueue::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// A new job; its provider key is the one the enqueued job was minted with.
    Created(JobId),
    /// A job with this key and payload already exists (or is within the dedupe window); the
    /// job just offered was dropped, its provider key with it.
    Duplicate {
        /// The existing job.
        id: JobId,
        /// The provider key stored with the existing job: the one a provider will see, not the
        /// one the dropped job was minted with. `None` where the backend cannot tell.
        provider_key: Option<ProviderKey>,
    },
    /// The key's job ran out of attempts (or failed for good) and its failure record is kept,
    /// open or discarded: nothing was enqueued and nothing will run. Replay the record to run it
    /// again; once the record is purged, the key is free and an enqueue creates a new job.
    Failed {
        /// The failed job.
        id: JobId,
    },
}

impl Enqueued {
    /// The job's id, new or existing.
    pub fn id(&self) -> &JobId {
        match self {
            Self::Created(id) | Self::Duplicate { id, .. } | Self::Failed { id } => id,
        }
    }

    /// Whether this call created the job.
    pub fn is_created(&self) -> bool {
        matches!(self, Self::Created(_))
    }
}

/// Adds jobs.
pub trait Enqueue: Backend {
    /// Adds one job. Errors: [`KeyConflict`](crate::ErrorKind::KeyConflict) for the same key
    /// with a different payload (where the backend can see it at enqueue),
    /// [`PayloadTooLarge`](crate::ErrorKind::PayloadTooLarge) before anything is sent.
    fn enqueue(&self, job: NewJob) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Adds many jobs, in order; one answer per job. A backend sends them in as few calls as
    /// it can; the whole batch is refused if any payload is too large.
    fn enqueue_batch(&self, jobs: Vec<NewJob>) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
}

/// Typed conveniences over [`Enqueue`].
pub trait EnqueueExt: Enqueue {
    /// Enqueues a typed job: derives its key from its fields, mints its provider key.
    fn enqueue_job<J: Job + Sync>(&self, job: &J) -> impl Future<Output = Result<Enqueued>> + Send {
        let new = NewJob::from_job(job);
        async move { self.enqueue(new?).await }
    }

    /// Enqueues `job` to run no earlier than `at`.
    fn enqueue_at(&self, job: NewJob, at: DateTime<Utc>) -> impl Future<Output = Result<Enqueued>> + Send {
        self.enqueue(job.run_at(at))
    }

    /// Enqueues `job` to run no earlier than `delay` from now.
    fn enqueue_in(&self, job: NewJob, delay: Duration) -> impl Future<Output = Result<Enqueued>> + Send {
        self.enqueue(job.run_in(delay))
    }
}

impl<T: Enqueue + ?Sized> EnqueueExt for T {}

/// A claimed job's exclusive hold. Every later call about the job presents it; a lease that is
/// no longer the job's current one gets [`LeaseLost`](crate::ErrorKind::LeaseLost).
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// The fencing token: a lease token, SQS receipt handle or Azure pop receipt.
    /// Never logged.
    pub token: String,
}

/// A job taken by [`Claim::claim`].
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The job.
    pub job: JobRecord,
    /// Its lease.
    pub lease: Lease,
    /// The ledger state of the job's key, where the queue is the ledger of its own jobs
    /// (Postgres: the job row is its key's entry, and the claim took the key). `None`: ask the
    /// [`Ledger`].
    pub begun: Option<Begin>,
}

/// Which job kinds a claim takes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Kinds {
    /// Any kind (tools and tests).
    #[default]
    Any,
    /// Only these (a worker's handlers).
    Only(Vec<String>),
}

impl Kinds {
    /// Whether a job of `kind` is wanted.
    pub fn wants(&self, kind: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(kinds) => kinds.iter().any(|k| k == kind),
        }
    }
}

/// Takes jobs under a lease and settles them.
pub trait Claim: Backend {
    /// Takes up to `max` ready jobs of `kinds` for `lease`, counting an attempt on each. Waits up
    /// to `wait` for work when there is none, then returns an empty list. A backend without
    /// [`Capabilities::claim_by_kind`] may return jobs of any kind.
    fn claim(
        &self,
        kinds: &Kinds,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>>> + Send;

    /// The job is done; it will not run again. `result` is the effect's result, stored where the
    /// queue is its own jobs' ledger ([`Claimed::begun`]); others ignore it.
    fn complete(&self, lease: &Lease, result: Option<&Value>) -> impl Future<Output = Result<()>> + Send;

    /// The attempt failed; make the job ready again after `delay`, keeping `error`.
    fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> impl Future<Output = Result<()>> + Send;

    /// Puts the job back for `delay` without it counting as an attempt: another attempt holds its
    /// key, the worker has no handler for its kind, or the effect ledger is unreachable. Nothing
    /// is written to its error history, and no number of deferrals leads to a failure record.
    fn defer(&self, lease: &Lease, delay: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Gives back, ready at once, a job whose handler never started (claimed ahead, then shutdown
    /// or a long wait in the buffer). The attempt is given back where
    /// [`Capabilities::release_refunds`] says so.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<()>> + Send;

    /// Ends the job as a failure record with the full payload, `error` as the last error and
    /// the attempts used. Returns the record, or `None` where the service writes it later and
    /// assigns its id then (QStash); either way the worker's alert pass finds it.
    fn dead_letter(&self, job: &Claimed, error: &str) -> impl Future<Output = Result<Option<FailureRecord>>> + Send;

    /// Lease renewal, where the backend has it (see [`Renew`]). Without it, jobs are claimed on
    /// the worker's full lease and a handler that outlives it is cancelled before its key's hold
    /// lapses.
    fn renewal(&self) -> Option<&impl Renew> {
        None::<&NoRenewal>
    }
}

/// Extends leases: the heartbeat of long handlers, and the move of a started job from its
/// claim lease to the full lease.
pub trait Renew: Send + Sync {
    /// Extends the lease to `by` from now. Returns the lease to present from now on: the same
    /// one, or a new token where the backend changes it on every update (Azure's pop receipt).
    /// A renewal also marks the job started (see [`Capabilities::crash_refunds`]).
    fn renew(&self, lease: &Lease, by: Duration) -> impl Future<Output = Result<Lease>> + Send;
}

/// The [`Renew`] of a backend that has none; it cannot be made.
#[derive(Debug)]
pub enum NoRenewal {}

impl Renew for NoRenewal {
    async fn renew(&self, _lease: &Lease, _by: Duration) -> Result<Lease> {
        match *self {}
    }
}

/// A backend's id for a failure record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FailureId(pub String);

impl std::fmt::Display for FailureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One failed attempt in a record's error history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt's number.
    pub attempt: u32,
    /// When it failed.
    pub at: DateTime<Utc>,
    /// The error it ended with.
    pub error: String,
}

/// Where a failure record stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum RecordState {
    /// Waiting for a person.
    Open,
    /// Put back on the queue with its original keys.
    Replayed {
        /// When.
        at: DateTime<Utc>,
        /// Why (may be empty: a replay loses nothing). Empty on records replayed before replays
        /// were audited, and while a broker's replay is being sent.
        #[serde(default)]
        reason: String,
        /// Who.
        #[serde(default)]
        actor: String,
    },
    /// Closed without a replay.
    Discarded {
        /// When.
        at: DateTime<Utc>,
        /// Why.
        reason: String,
        /// Who.
        actor: String,
    },
}

impl RecordState {
    /// Whether the record still waits for a person.
    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }
}

/// A dead-letter entry: everything a person needs to understand and replay the job.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The record's id.
    pub id: FailureId,
    /// The failed job's id.
    pub job_id: JobId,
    /// The job kind.
    pub kind: String,
    /// The business-fact key, reused by a replay.
    pub key: IdempotencyKey,
    /// The provider key, reused by a replay.
    pub provider_key: ProviderKey,
    /// The full payload.
    pub payload: Value,
    /// The last attempt's error.
    pub last_error: String,
    /// Every failed attempt the backend kept, oldest first (may hold only the last).
    pub errors: Vec<AttemptError>,
    /// Attempts used.
    pub attempts: u32,
    /// The cap the job had.
    pub cap: u32,
    /// The job's alert severity.
    pub severity: Severity,
    /// The first failed attempt's time.
    pub first_failed_at: DateTime<Utc>,
    /// When the record was written.
    pub last_failed_at: DateTime<Utc>,
    /// Open, replayed or discarded.
    pub state: RecordState,
}

/// Which records [`DeadLetter::list`] returns, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureQuery {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only the records of this idempotency key (a job dead-lettered, replayed and
    /// dead-lettered again has several).
    pub key: Option<IdempotencyKey>,
    /// Only the records of this job (the id [`Enqueue`] answered, or [`JobContext::job_id`](crate::JobContext::job_id)).
    pub job_id: Option<JobId>,
    /// Only open records (`Some(true)`), only closed ones (`Some(false)`), or all.
    pub open: Option<bool>,
    /// Only records that failed before this time.
    pub failed_before: Option<DateTime<Utc>>,
    /// Records after this id (the last id of the previous page).
    pub after: Option<FailureId>,
    /// At most this many; `0` means 100.
    pub limit: usize,
}

impl FailureQuery {
    /// Open records of any kind, first page.
    pub fn open() -> Self {
        Self { open: Some(true), ..Self::default() }
    }

    /// Every record (open or closed) of `key`.
    pub fn by_key(key: IdempotencyKey) -> Self {
        Self { key: Some(key), ..Self::default() }
    }

    /// Every record (open or closed) of the job `id`.
    pub fn by_job(id: JobId) -> Self {
        Self { job_id: Some(id), ..Self::default() }
    }

    /// The page size, with the default applied.
    pub fn page_size(&self) -> usize {
        if self.limit == 0 { 100 } else { self.limit }
    }

    /// Whether `record` passes the filters (not the paging).
    pub fn matches(&self, record: &FailureRecord) -> bool {
        self.kind.as_ref().is_none_or(|k| *k == record.kind)
            && self.key.as_ref().is_none_or(|k| *k == record.key)
            && self.job_id.as_ref().is_none_or(|id| *id == record.job_id)
            && self.open.is_none_or(|open| open == record.state.is_open())
            && self.failed_before.is_none_or(|t| record.last_failed_at < t)
    }
}

/// Reads and manages failure records without consuming them.
pub trait DeadLetter: Send + Sync {
    /// Records matching `query`, oldest first.
    fn list(&self, query: &FailureQuery) -> impl Future<Output = Result<Vec<FailureRecord>>> + Send;

    /// One record; [`NotFound`](crate::ErrorKind::NotFound) if it does not exist.
    fn get(&self, id: &FailureId) -> impl Future<Output = Result<FailureRecord>> + Send;

    /// How many records are open: the figure a health check or metric reads.
    fn count_open(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Closes an open record without replaying it, keeping why and who. A blank `reason` or
    /// `actor` is refused ([`InvalidInput`](crate::ErrorKind::InvalidInput), see
    /// [`require_audit`]): the work is dropped, and the record is what says why and by whom.
    fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> impl Future<Output = Result<()>> + Send;

    /// Deletes records (any state) whose last failure is older than `age`, payloads included.
    /// Returns how many.
    fn purge(&self, age: Duration) -> impl Future<Output = Result<u64>> + Send;
}

/// What [`Replay::replay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The job is back on the queue with its original keys; the record is closed as replayed.
    Replayed(JobId),
    /// The record was already closed; nothing was enqueued.
    AlreadyClosed(RecordState),
}

/// Puts failed jobs back.
pub trait Replay: Send + Sync {
    /// Replays one open record with its original keys and closes it as replayed, keeping why and
    /// who, as a discard does. A blank `actor` is refused
    /// ([`InvalidInput`](crate::ErrorKind::InvalidInput)); `reason` may be empty (a replay drops
    /// nothing; its usual reason is the fix just deployed).
    fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> impl Future<Output = Result<ReplayOutcome>> + Send;
}

/// Refuses `text` if it is blank: what a record keeps of who closed it (and why, for a discard).
/// `what` names it in the error (`"a discard's reason"`). Every backend checks before it changes
/// anything.
pub fn require_audit(what: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, format!("{what} is required: it stays with the record")));
    }
    Ok(())
}

/// Conveniences over [`Replay`] and [`DeadLetter`].
pub trait ReplayExt: Replay + DeadLetter {
    /// Replays every open record matching `query` (all pages), at most `per_second` a second,
    /// each closed with `reason` and `actor` (see [`Replay::replay`]). Returns the jobs put back.
    fn replay_matching(
        &self,
        query: &FailureQuery,
        per_second: u32,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<Vec<JobId>>> + Send {
        let mut query = FailureQuery { open: Some(true), after: None, ..query.clone() };
        let gap = Duration::from_secs(1) / per_second.max(1);
        async move {
            require_audit("a replay's actor", actor)?;
            let mut replayed = Vec::new();
            let mut pace = tokio::time::interval(gap);
            loop {
                let page = self.list(&query).await?;
                for record in &page {
                    pace.tick().await;
                    if let ReplayOutcome::Replayed(job) = self.replay(&record.id, reason, actor).await? {
                        replayed.push(job);
                    }
                }
                match page.last() {
                    Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                    _ => return Ok(replayed),
                }
            }
        }
    }
}

impl<T: Replay + DeadLetter + ?Sized> ReplayExt for T {}

/// How many jobs a queue holds, by state. Finished jobs and failure records are not counted
/// (see [`DeadLetter::count_open`] for those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Waiting to be claimed: ready now, or after a retry's delay.
    pub queued: u64,
    /// Claimed and not settled yet: a handler is on them, or their lease lapsed and they have
    /// not been taken again.
    pub running: u64,
    /// Of `queued`, those waiting for a time (a retry's delay, a deferral, a delayed send), not
    /// ready yet. `None` where the broker cannot tell (Azure).
    pub scheduled: Option<u64>,
    /// How long the oldest ready job has waited since it became ready: the figure that says a
    /// queue is falling behind. `None` when nothing is ready, or where the broker cannot tell
    /// (SQS, Azure: read their own metrics, `ApproximateAgeOfOldestMessage` on SQS).
    pub oldest_ready: Option<Duration>,
}

impl Counts {
    /// Queued and running together: the jobs not finished yet.
    pub fn unfinished(&self) -> u64 {
        self.queued + self.running
    }

    /// Nothing queued, nothing running.
    pub fn is_drained(&self) -> bool {
        self.unfinished() == 0
    }
}

/// Counts a queue's jobs: the figures a dashboard, a test or a deploy script reads.
pub trait QueueStats: Send + Sync {
    /// The jobs queued and running now. Exact where the backend stores jobs (memory, Postgres);
    /// approximate where the broker only estimates (SQS).
    fn counts(&self) -> impl Future<Output = Result<Counts>> + Send;
}

/// Conveniences over [`QueueStats`].
pub trait QueueStatsExt: QueueStats {
    /// Waits until nothing is queued or running, or `timeout` passes, looking every 50 ms at
    /// first and every second at most. Returns the last counts read: drained
    /// ([`Counts::is_drained`]), or what was left when the time ran out.
    fn wait_until_drained(&self, timeout: Duration) -> impl Future<Output = Result<Counts>> + Send {
        async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut pause = Duration::from_millis(50);
            loop {
                let counts = self.counts().await?;
                let now = tokio::time::Instant::now();
                if counts.is_drained() || now >= deadline {
                    return Ok(counts);
                }
                tokio::time::sleep(pause.min(deadline - now)).await;
                // Each look is a query (or, on SQS, a billed request): look less often as it waits.
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl<T: QueueStats + ?Sized> QueueStatsExt for T {}

/// A key held by one attempt in the effect ledger.
#[derive(Clone, PartialEq, Eq)]
pub struct Hold {
    /// The key.
    pub key: IdempotencyKey,
    /// This attempt's token; a hold taken over by a later attempt no longer matches.
    pub token: String,
    /// The key's provider key: minted with the first job that began the key, and the same for
    /// every later attempt and every later message of the key.
    pub provider_key: ProviderKey,
    /// Set where the hold is the job's own lease ([`Claimed::begun`]): the hold is kept by
    /// renewing the lease, and ends when the job is settled.
    pub lease: Option<Lease>,
}

/// What [`Ledger::begin`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// No attempt has started this effect: go ahead.
    Fresh(Hold),
    /// An earlier attempt started the effect and did not finish; it may have reached the
    /// provider. Go ahead with the provider key.
    Resumed(Hold),
    /// Another attempt holds the key right now: try again after this long.
    Busy(Duration),
    /// The effect happened; here is its stored result. Skip.
    Done(Value),
}

/// The effect ledger (processed keys): what makes an effect happen once, whatever the queue
/// delivers. Key first: `begin` marks the key pending before the outside call, `finish` marks it
/// done after.
pub trait Ledger: Send + Sync {
    /// Starts an attempt at the effect of `key`, holding it for `hold`. The payload's
    /// [fingerprint](crate::payload_fingerprint) is stored with the key; a later begin with
    /// another payload is a [`KeyConflict`](crate::ErrorKind::KeyConflict). `provider_key` is
    /// stored if the key is new; the hold carries the stored one.
    fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> impl Future<Output = Result<Begin>> + Send;

    /// Keeps holding the key for `by` from now.
    fn extend_hold(&self, hold: &Hold, by: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Lets go of the key without finishing: it stays pending, and the next attempt resumes.
    fn release_hold(&self, hold: &Hold) -> impl Future<Output = Result<()>> + Send;

    /// Marks the effect done with its result. Idempotent.
    fn finish(&self, hold: &Hold, result: &Value) -> impl Future<Output = Result<()>> + Send;
}

debug_redacted!(Lease { show: [job_id], hide: [token] });
debug_redacted!(Hold { show: [key, provider_key, lease], hide: [token] });
debug_redacted!(FailureRecord {
    show: [
        id,
        job_id,
        kind,
        key,
        provider_key,
        last_error,
        errors,
        attempts,
        cap,
        severity,
        first_failed_at,
        last_failed_at,
        state
    ],
    hide: [payload],
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replayed_state_kept_before_replays_were_audited_still_reads() {
        // As broker stores kept it (JSON), and as a take reads until its replay closes it.
        let old: RecordState = serde_json::from_str(r#"{"state":"replayed","at":"2026-01-02T03:04:05Z"}"#).unwrap();
        assert!(matches!(old, RecordState::Replayed { reason, actor, .. } if reason.is_empty() && actor.is_empty()));
    }

    #[test]
    fn blank_audit_text_is_refused_as_invalid_input() {
        for blank in ["", " ", "\t\n"] {
            let refused = require_audit("a discard's reason", blank).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidInput);
            assert!(refused.to_string().contains("a discard's reason is required"), "{refused}");
        }
        assert!(require_audit("a discard's reason", "refunded").is_ok());
    }
}
