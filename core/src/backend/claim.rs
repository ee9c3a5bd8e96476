//! [`Claim`] and [`Renew`]: taking jobs under a lease and settling them.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use super::{Backend, Begin, Cancellation, FailureId, FailureRecord};
use crate::error::Result;
use crate::job::{JobId, JobRecord};
use crate::redact::debug_redacted;

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
    /// [`Ledger`](super::Ledger).
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
    /// [`Capabilities::claim_by_kind`](super::Capabilities::claim_by_kind) may return jobs of any kind.
    fn claim(
        &self,
        kinds: &Kinds,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>>> + Send;

    /// The kinds a worker has handlers for, told once as it starts, whether or not a kind is
    /// paused (a paused kind is not claimed while the backend claims by kind). A push backend
    /// tells by it a call of a kind that is only paused here from one no worker here handles,
    /// which it makes a record after its rounds. Nothing by default; a wrapper passes it on.
    fn handles(&self, kinds: &Kinds) {
        let _ = kinds;
    }

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
    /// [`Capabilities::release_refunds`](super::Capabilities::release_refunds) says so.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<()>> + Send;

    /// Ends the job as a failure record with the full payload, `error` as the last error and
    /// the attempts used. Returns the record, or `None` where the service writes it later and
    /// assigns its id then (QStash); either way the worker's alert pass finds it.
    ///
    /// The record keeps the trace id of `job.job`'s `traceparent` as handed over here
    /// ([`JobRecord::trace_id`]), not as stored: the worker hands the job over with the failing
    /// attempt's own trace context there where its span has one (the `otel` feature).
    fn dead_letter(&self, job: &Claimed, error: &str) -> impl Future<Output = Result<Option<FailureRecord>>> + Send;

    /// Closes the failure record `record` as confirmed: the job that replays it
    /// ([`JobRecord::replay_of`]) has its effect done, by its handler or before it (the effect
    /// ledger answered done). The worker calls it before completing such a job, so that a crash
    /// between the two leaves a job that runs again, finds its effect done and confirms then.
    /// Idempotent: a record no longer replaying is left as it is. Backends whose completion
    /// confirms the record itself never set `replay_of` and answer `Ok`; a broker backend answers
    /// with [`confirm_replay`](crate::kit::broker::confirm_replay); a wrapper passes it on.
    fn confirm_replay(&self, record: &FailureId) -> impl Future<Output = Result<()>> + Send;

    /// Closes the failure record `record` as discarded with the cancel's who and why: the job
    /// that replays it ([`JobRecord::replay_of`]) was withdrawn unrun, its key cancelled in the
    /// effect ledger ([`Ledger::cancel_effect`](crate::kit::Ledger::cancel_effect)), so nothing
    /// will ever settle it. Idempotent, like [`confirm_replay`](Self::confirm_replay). Backends
    /// whose own cancel closes the record never set `replay_of` and answer `Ok`; a broker backend
    /// answers with [`withdraw_replay`](crate::kit::broker::withdraw_replay); a wrapper passes it
    /// on.
    fn withdraw_replay(&self, record: &FailureId, cancel: &Cancellation) -> impl Future<Output = Result<()>> + Send;

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
    /// A renewal also marks the job started (see [`Capabilities::crash_refunds`](super::Capabilities::crash_refunds)).
    fn renew(&self, lease: &Lease, by: Duration) -> impl Future<Output = Result<Lease>> + Send;

    /// Extends the lease of a job whose handler is done while its settlement is written (a
    /// stalled database, a settlement tried again): as [`renew`](Self::renew), but a cancel asked
    /// of the job does not refuse it, because the settlement decides now (a completion wins over
    /// the cancel; anything else ends it cancelled). Backends whose renewal never answers
    /// [`Cancelled`](crate::ErrorKind::Cancelled) keep this default.
    fn renew_settling(&self, lease: &Lease, by: Duration) -> impl Future<Output = Result<Lease>> + Send {
        self.renew(lease, by)
    }
}

/// The [`Renew`] of a backend that has none; it cannot be made.
#[derive(Debug)]
pub enum NoRenewal {}

impl Renew for NoRenewal {
    async fn renew(&self, _lease: &Lease, _by: Duration) -> Result<Lease> {
        match *self {}
    }
}

debug_redacted!(Lease { show: [job_id], hide: [token] });
