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
//! | [`Flow`] | optional, in the ledger's database: paused kinds, limits, rate buckets and concurrency slots |
//! | [`QueueStats`] | how many jobs are queued and running |
//! | [`Jobs`] | optional, where the jobs are stored: the live jobs listed, read and cancelled |
//!
//! Conveniences (typed jobs, replay by filter, waiting for a queue to drain) live in
//! [`EnqueueExt`], [`ReplayExt`] and [`QueueStatsExt`].
//!
//! # Attempts
//!
//! An attempt is a handler start. A backend counts one at claim, and gives it back where it can
//! when the handler never started: [`Claim::defer`] always does, [`Claim::release`] and the
//! return of a lapsed claim where [`Capabilities`] say so.
//!
//! Each contract is in a file of its own, with the types it speaks in; they are all re-exported
//! here.

mod claim;
mod dead_letter;
mod enqueue;
mod flow;
mod forget;
mod jobs;
mod ledger;
mod stats;

use std::time::Duration;

pub use claim::{Claim, Claimed, Kinds, Lease, NoRenewal, Renew};
pub use dead_letter::{
    AttemptError, Blocked, DeadLetter, FailureId, FailureQuery, FailureRecord, RecordState, Replay, ReplayExt,
    ReplayOutcome, refuse_amend, require_audit,
};
pub use enqueue::{Enqueue, EnqueueExt, Enqueued};
pub use flow::{
    BREAKER, Flow, FlowAction, FlowEvent, KindFlow, Limits, NoFlow, Paused, Rate, Slot, Tokens, check_kind,
    check_pause, gcra, rate_columns, require_history, stored_count, stored_rate,
};
pub use forget::{Forget, Forgotten};
pub use jobs::{
    CancelOutcome, Cancellation, JobQuery, JobState, Jobs, JobsExt, LiveJob, Running, check_cancel,
    require_cancel_audit,
};
pub use ledger::{Begin, Hold, Ledger};
pub use stats::{Counts, QueueStats, QueueStatsExt};

/// How a backend treats the same key enqueued twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// Both copies are delivered; the effect ledger keeps the effect to one (SQS standard, Azure).
    None,
    /// Within this window after the first, a second copy with the same payload is dropped (SQS
    /// FIFO: 5 minutes; QStash); a copy with another payload is delivered, and the effect ledger
    /// turns it into a key-conflict record.
    Window(Duration),
    /// Within this window after the first, a second copy with the same payload is dropped by the
    /// service, and the enqueue cannot tell: both answer [`Enqueued::Created`] (Inngest: an
    /// event's `id` starts one run of a function for 24 hours, and its event API answers every
    /// event alike). A copy with another payload is delivered, and the effect ledger turns it
    /// into a key-conflict record.
    Unreported(Duration),
    /// For as long as the first job is kept: a second copy answers
    /// [`Enqueued::Duplicate`] (Postgres, memory).
    Kept,
}

/// What a backend can do, declared through the contract so that the worker and the conformance
/// suite read it rather than have it restated. Each field is a promise something reads: the
/// worker acts on it, or a conformance scenario (named below) holds the backend to it. A field
/// nothing reads does not belong here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// What enqueuing a key twice does. Read by the suite's `replay`, `race` and `key_conflict`.
    pub dedupe: Dedupe,
    /// The largest payload accepted, in bytes; one more is refused with
    /// [`PayloadTooLarge`](crate::ErrorKind::PayloadTooLarge) before anything is sent. Read by
    /// the suite's `oversized` and `payload_limits`.
    pub max_payload: usize,
    /// The most jobs one claim returns (SQS: 10); the worker asks for no more.
    pub max_claim: usize,
    /// A batch enqueue stores all of its jobs or none: a batch refused for one job (a key reused
    /// with another payload) leaves no job of it behind. Held to by the suite's `atomic_batch`.
    pub atomic_batch: bool,
    /// [`Claim::release`] gives the attempt back (a queue that counts receives cannot); the
    /// worker then releases a job whose handler never started rather than deferring it.
    pub release_refunds: bool,
    /// A claim that lapses before its handler started gives the attempt back when the job returns
    /// (see [`JobRecord::stranded`](crate::JobRecord::stranded)); otherwise a crash charges every
    /// job its worker had claimed. Held to by the suite's `crash_refunds`.
    pub crash_refunds: bool,
    /// [`Claim::claim`] takes only the kinds asked for. Otherwise the worker hands back, by
    /// [`Claim::defer`], the jobs of kinds it has no handler for. Held to by the suite's
    /// `claim_by_kind`.
    pub claim_by_kind: bool,
    /// The shortest lease the backend honours (SQS: 1 s); the suite's expiry scenarios ask for
    /// no shorter.
    pub min_lease: Duration,
    /// The longest delay the backend holds a scheduled job back by itself
    /// ([`NewJob::not_before`](crate::NewJob::not_before)); `None`: none. A job claimed before its
    /// time (past this cap, or on a backend without one) carries its time
    /// ([`JobRecord::not_before`](crate::JobRecord::not_before)) and is put back by the worker
    /// until then, at no attempt's cost. Held to by the suite's `max_delay`.
    pub max_delay: Option<Duration>,
    /// Jobs of one [`order_key`](crate::Job::order_key) run one at a time in enqueue order, and
    /// an open failure record of one blocks the rest until it is replayed or discarded
    /// ([`DeadLetter::blocked`](crate::DeadLetter::blocked) lists them). Otherwise enqueue refuses
    /// a job with an order key ([`NewJob::check_fits`](crate::NewJob::check_fits)). Held to by
    /// the suite's `ordered_through_failure`.
    pub order_per_key: bool,
    /// [`Replay::replay_amended`](crate::Replay::replay_amended) replays a record with a
    /// corrected payload under its keys (the key's ledger entry is the backend's own, so its
    /// fingerprint moves with the payload). Otherwise it refuses with
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput). Held to by the suite's `amended_replay`.
    pub amend_replay: bool,
    /// The backend lists its jobs, cancels queued ones and asks running ones to stop ([`Jobs`]:
    /// memory, PostgreSQL, SQLite). Otherwise (a broker holds its messages unlisted) every [`Jobs`] call is refused
    /// as [`Unsupported`](crate::ErrorKind::Unsupported). Held to by the suite's `cancel` and
    /// `cancel_running`.
    pub live_jobs: bool,
    /// Claims take the ready jobs of the highest [`priority`](crate::Job::priority) first, oldest
    /// first within one. Otherwise enqueue refuses a job of any priority but 0
    /// ([`NewJob::check_fits`](crate::NewJob::check_fits)). Held to by the suite's
    /// `priorities`.
    pub priorities: bool,
}

impl Default for Capabilities {
    /// What a queue can be held to at the least, with everything else the in-memory backend does:
    /// no order per key, no priorities and no live jobs (a backend that has them says so), at 256 KiB.
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
            max_delay: Some(Duration::MAX),
            order_per_key: false,
            amend_replay: false,
            live_jobs: false,
            priorities: false,
        }
    }
}

/// Declares what a backend can do.
pub trait Backend: Send + Sync {
    /// The backend's capabilities; the same answer every time.
    fn capabilities(&self) -> Capabilities;

    /// The messaging system, as a job's span names it with the `otel` feature (OpenTelemetry's
    /// `messaging.system`: `aws_sqs`, `postgresql`, …). `None` (the default): not named.
    fn messaging_system(&self) -> Option<&'static str> {
        None
    }

    /// The queue jobs are claimed from, as a job's span names it with the `otel` feature
    /// (OpenTelemetry's `messaging.destination.name`). `None` (the default): not named. Never a
    /// secret: no connection string, no token.
    fn messaging_destination(&self) -> Option<String> {
        None
    }
}
