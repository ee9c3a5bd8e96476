//! The conformance suite every redrive backend passes, and that you can run against your own.
//!
//! The behaviours, one public `async fn` each, every one taking a fresh [`Subject`]: the
//! queue under test, the effect ledger it runs with, and the suite's [`Timing`]. What the
//! backend can do is read from it ([`Backend::capabilities`](redrive_core::kit::Backend)), never
//! restated; differences between backends are declared, never skipped. Each scenario keeps its
//! own effect log with **no unique constraint**, so a duplicated effect shows, and ends by
//! sorting every key into done once / failure record / lost / duplicated / unexpected
//! ([`Report`]). It passes when nothing is lost, duplicated or unexpected, and the scenario's own
//! checks hold.
//!
//! The first fourteen are the promise under ordinary operation; then comes the **fault half**:
//! the same promise while renewals stall, the ledger is down, workers die or run only some kinds.
//! Then four hold the backend to the [`Capabilities`](redrive_core::kit::Capabilities) it declares
//! that nothing else reads: each capability is a promise the suite checks. The last are flow
//! control: a handler's "not now", a timeout per kind, a paused kind, a circuit breaker through an
//! outage, a rate limit, and concurrency limits per kind and per key (kept in the ledger's flow
//! store, shared by every worker), order per key through a failure, and priorities. Then replays
//! settled by their job (failed again, and amended), the cancel of a queued job, and the producer's
//! trace context carried to the handler and kept by the failure record.
//!
//! | # | scenario | the invariant |
//! |---|---|---|
//! | 1 | [`replay`] | the same job enqueued twice: one effect |
//! | 2 | [`race`] | two workers given the same job at once: one effect, one recorded skip |
//! | 3 | [`exhaust`] | an always-failing job: `cap` attempts, one full failure record, one alert |
//! | 4 | [`recover`] | replay from the record: replaying until the effect happens once, then confirmed, with who and why; a second replay inert |
//! | 5 | [`key_conflict`] | the same key with another payload: a typed error, nothing changed |
//! | 6 | [`undecodable`] | a payload that does not decode: a failure record at once, no retries |
//! | 7 | [`oversized`] | a payload over the limit: a typed error, nothing sent |
//! | 8 | [`dead_worker`] | a worker that dies holding a lease: the job runs again after it, once |
//! | 9 | [`stale_lease`] | an expired, re-claimed lease cannot settle the job |
//! | 10 | [`many_workers`] | many workers, many jobs, duplicate keys: each key done once or recorded |
//! | 11 | [`discard_and_purge`] | discard with reason and actor (blank ones refused), records found and discarded by their error text, purge by age, counts right |
//! | 12 | [`graceful_shutdown`] | shutdown loses and duplicates nothing |
//! | 13 | [`stranded_claims`] | a worker that dies strands its claimed-ahead jobs for the claim lease, not the lease |
//! | 14 | [`slow_handler`] | a handler running 2.5× its lease, heartbeat on or off: one start, one effect |
//! | 15 | [`stalled_heartbeat`] | renewals cannot get through for longer than a lease: one effect |
//! | 16 | [`busy_never_dead_letters`] | a second delivery waiting behind a long handler: no attempt, no error, no record |
//! | 17 | [`ledger_outage`] | the ledger refuses connections for several leases: every job once, attempts unspent |
//! | 18 | [`provider_key_once`] | the first attempt dies after its call: the next one sends the same provider key |
//! | 19 | [`mixed_kinds`] | two workers, each with some of the kinds: nothing dead-lettered, every job once |
//! | 20 | [`crash_loop`] | a job that kills its worker, claimed with others: they finish, it ends as one record |
//! | 21 | [`alert_delivery`] | a flaky sink, a worker killed after the record: one alert per record |
//! | 22 | [`no_payload_in_logs`] | a canary in payloads that fail: in no log line, error or alert |
//! | 23 | [`purge_forgets`] | after purge the payload is nowhere; re-enqueuing the key runs it once |
//! | 24 | [`racing_replays`] | two readers paging at once see every record; two replays at once put a job back once |
//! | 25 | [`reminders`] | a record left open: one reminder per period though two workers sweep, none after its replay |
//! | 26 | [`expired`] | a job claimed past its deadline: dropped and counted, not run, not a record, not an alert |
//! | 27 | [`scheduled`] | a job enqueued to run later: no earlier than asked, once, on its first attempt |
//! | 28 | [`settle_retried`] | one worker's completions refused as busy for three leases, a second worker beside it: each job claimed once, its effect once |
//! | 29 | [`payload_limits`] | payloads at the limit, multibyte across it, awkward characters: delivered byte for byte or refused typed |
//! | 30 | [`no_receipt_in_logs`] | receipts, pop receipts and lease tokens, stale ones included: in no log line or error |
//! | 31 | [`atomic_batch`] | a batch refused for one job: none of it stored where `atomic_batch` is declared |
//! | 32 | [`claim_by_kind`] | a claim for one kind: no other kind where `claim_by_kind` is declared; handed back at no cost where not |
//! | 33 | [`crash_refunds`] | a claim that lapses unstarted: the attempt given back where `crash_refunds` is declared, charged where not |
//! | 34 | [`max_delay`] | a job scheduled within `max_delay` is held back by the backend; past it, claimed early only with its time |
//! | 35 | [`not_now`] | "not now" past the cap count: no attempt, no error, no record, the effect once; a job past `max_not_now` ends as a full record |
//! | 36 | [`timeout`] | a handler past its kind's timeout: cancelled, retried to a full "timed out after" record, the key free; a quick one once |
//! | 37 | [`paused_kind`] | a paused kind: none of its jobs start on any worker, other kinds run, all run once after the resume |
//! | 38 | [`outage_storm`] | a provider down under a circuit breaker: no record, one pause alert, probes only while paused, every effect once |
//! | 39 | [`rate_limited`] | a rate per kind across two workers: starts never outrun it, every job once on attempt 1 |
//! | 40 | [`kind_concurrency`] | a concurrency limit per kind across two workers: never more at once, every job once |
//! | 41 | [`key_concurrency`] | a concurrency limit per key: one tenant one at a time, the others not held behind it |
//! | 42 | [`ordered_through_failure`] | jobs of one order key: in enqueue order, one at a time, held behind an open record until its replay or discard; refused where order is not kept |
//! | 43 | [`priorities`] | one handler starts the ready jobs highest priority first, in enqueue order within one; a priority refused where claims ignore it |
//! | 44 | [`replay_failed_again`] | a replay whose job fails again: the old record names the new one and the new one it, never confirmed; the new one's replay confirmed |
//! | 45 | [`amended_replay`] | a replay with a corrected payload under the same keys: audited, run once with it, both payloads kept, confirmed; a plain enqueue of another payload still a `KeyConflict`; refused where the backend cannot amend |
//! | 46 | [`cancel`] | a queued or scheduled job cancelled by id or key: never runs, stays cancelled with its audit, its key taken; refused where jobs are not listed |
//! | 47 | [`cancel_running`] | a replayed job cancelled closes its record; a running job cancelled is stopped at its next renewal and ends cancelled with its audit, no effect, its key taken; a cancel asked of a job that then fails for good is spent, its replay runs |
//! | 48 | [`cancel_key_in_ledger`] | where jobs are not listed (a broker's), a key cancelled in the effect ledger: its message completes unrun, a handler running it is stopped, no effect; a replay so withdrawn closes its record; a done key refused |
//! | 49 | [`trace_context`] | a producer's `traceparent`, alone and in a batch, reaches the handler; a failure record and its alert keep its trace id; an invalid one refused at enqueue |
//! | 50 | [`forget_key`] | a key forgotten after its failure record and alert: its payload nowhere, no record open, nothing left to forget again; enqueued again it runs once |
//!
//! # Running it against your backend
//!
//! Write an `async fn` that returns a [`Subject`] on fresh, isolated storage (its own schema or
//! queue), then let [`suite!`] write one named test per behaviour. Your crate needs `tokio` (with the
//! `macros` and `rt-multi-thread` features) as a dev-dependency.
//!
//! ```
//! use redrive_conformance::{Subject, Timing};
//! use redrive_core::MemoryBackend;
//!
//! async fn my_backend() -> Subject<MemoryBackend, MemoryBackend> {
//!     // Replace with your backend, created fresh for each test.
//!     let backend = MemoryBackend::new();
//!     let (probe, forgetter) = (backend.clone(), backend.clone());
//!     Subject::new(backend.clone(), backend, Timing::default())
//!         // How `purge_forgets` looks into the backend's storage for a payload.
//!         .storage(move |text| {
//!             let probe = probe.clone();
//!             async move { probe.holds_text(&text) }
//!         })
//!         // How `forget_key` forgets a key: `Forget` on the store (and the ledger, if apart).
//!         .forget(move |key| {
//!             let backend = forgetter.clone();
//!             async move { redrive_core::Forget::forget_key(&backend, &key).await }
//!         })
//! }
//!
//! // In tests/conformance.rs: one #[tokio::test] per scenario, named after it.
//! redrive_conformance::suite!(my_backend());
//! ```
//!
//! Run one behaviour alone with `cargo test exhaust`.
//!
//! # A worker process killed mid-job
//!
//! One fault needs a process to kill: [`kill_worker_mid_job`] re-runs your test binary as a
//! worker, kills it with SIGKILL while its handlers run, and checks that a second worker finishes
//! every job once. It is not in [`suite!`]: its documentation shows the test to write.

mod capabilities;
mod control;
mod faults;
mod flaky;
mod flow;
pub mod flow_store;
mod forget;
mod frozen;
mod harness;
mod leases;
mod limits;
mod live;
mod logs;
mod order;
mod priority;
mod process;
mod receipts;
mod records;
mod replays;
mod scenarios;
mod schedule;
mod settling;
mod trace;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use capabilities::{atomic_batch, claim_by_kind, crash_refunds, max_delay};
pub use control::{key_concurrency, kind_concurrency, outage_storm, paused_kind, rate_limited};
pub use faults::*;
pub use flaky::FlakyStore;
pub use flow::{not_now, timeout};
pub use forget::forget_key;
pub use harness::{Effect, OTHER_KIND, OtherProbe, PROBE_KIND, Probe};
pub use leases::{dead_worker, graceful_shutdown, slow_handler, stale_lease, stranded_claims};
pub use limits::*;
pub use live::{cancel, cancel_key_in_ledger, cancel_running};
pub use order::ordered_through_failure;
pub use priority::priorities;
pub use process::{EnqueueJobs, hang_until_killed, is_killed_child, kill_worker_mid_job};
pub use receipts::*;
pub use records::check_record_store;
use redrive_core::kit::Claim;
use redrive_core::{DeadLetter, Enqueue, Forget, Forgotten, IdempotencyKey, MemoryBackend, Replay};
pub use replays::{amended_replay, replay_failed_again};
pub use scenarios::*;
pub use schedule::{expired, scheduled};
pub use settling::settle_retried;
pub use trace::trace_context;

/// What a queue must implement to be tested.
pub trait Queue: Enqueue + Claim + DeadLetter + Replay + Clone + 'static {}
impl<T: Enqueue + Claim + DeadLetter + Replay + Clone + 'static> Queue for T {}

/// The suite's timing knobs, apart from what the backend declares it can do.
#[derive(Debug, Clone)]
pub struct Timing {
    /// The lease the scenarios' workers use; shorter makes the suite faster, but it must be
    /// longer than one claim-to-settle round trip.
    pub lease: Duration,
    /// How long a scenario keeps watching after the expected state, to catch late
    /// duplicates. Keep it above `lease`.
    pub settle: Duration,
    /// Longest wait for a scenario's expected state.
    pub timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self { lease: Duration::from_secs(1), settle: Duration::from_millis(1500), timeout: Duration::from_secs(30) }
    }
}

/// Whether a text appears anywhere the backend keeps data: how [`purge_forgets`] checks that a
/// purged payload is gone.
pub type Storage = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Forgets a key everywhere the backend keeps it ([`Forget::forget_key`] on its store, and on
/// the ledger where that is another): how [`forget_key`] forgets.
pub type Forgetter =
    Arc<dyn Fn(IdempotencyKey) -> Pin<Box<dyn Future<Output = redrive_core::Result<Forgotten>> + Send>> + Send + Sync>;

/// A backend under test: fresh, isolated storage for one scenario.
#[derive(Clone)]
pub struct Subject<Q, L> {
    /// The queue (enqueue, claim, dead letters, replay).
    pub queue: Q,
    /// The effect ledger the worker uses (often the same backend).
    pub ledger: L,
    /// The suite's timing.
    pub timing: Timing,
    /// A look into the backend's storage; [`purge_forgets`] fails without one.
    pub storage: Option<Storage>,
    /// How to forget a key; [`forget_key`] fails without one.
    pub forget: Option<Forgetter>,
}

impl<Q, L> Subject<Q, L> {
    /// A subject on `queue` and `ledger`.
    pub fn new(queue: Q, ledger: L, timing: Timing) -> Self {
        Self { queue, ledger, timing, storage: None, forget: None }
    }

    /// Says how to look for a text in the backend's storage (a payload left behind).
    pub fn storage<F, Fut>(mut self, holds_text: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.storage = Some(Arc::new(move |text| Box::pin(holds_text(text))));
        self
    }

    /// Says how to forget a key everywhere the backend keeps it: [`Forget::forget_key`] on the
    /// store (a broker's records store), summed with the ledger's where that is another.
    pub fn forget<F, Fut>(mut self, forget: F) -> Self
    where
        F: Fn(IdempotencyKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = redrive_core::Result<Forgotten>> + Send + 'static,
    {
        self.forget = Some(Arc::new(move |key| Box::pin(forget(key))));
        self
    }
}

impl<Q, L> fmt::Debug for Subject<Q, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject").field("timing", &self.timing).finish_non_exhaustive()
    }
}

/// The in-memory backend as a subject: the reference every other backend is held to.
pub fn memory() -> Subject<MemoryBackend, MemoryBackend> {
    let backend = MemoryBackend::new();
    let probe = backend.clone();
    let forgetter = backend.clone();
    Subject::new(backend.clone(), backend, Timing::default())
        .storage(move |text| {
            let probe = probe.clone();
            async move { probe.holds_text(&text) }
        })
        .forget(move |key| {
            let backend = forgetter.clone();
            async move { backend.forget_key(&key).await }
        })
}

/// Where each key ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One effect, no open record, and that was expected.
    pub done_once: Vec<IdempotencyKey>,
    /// No effect, one open record, and that was expected.
    pub failure_record: Vec<IdempotencyKey>,
    /// No effect and no record: work silently unfinished.
    pub lost: Vec<IdempotencyKey>,
    /// More than one effect.
    pub duplicated: Vec<IdempotencyKey>,
    /// Anything else: an effect for a key nobody enqueued, an effect and a record, a record
    /// where an effect was expected or the other way round, two open records for one key.
    pub unexpected: Vec<IdempotencyKey>,
}

impl Report {
    /// Whether nothing was lost, duplicated or unexpected.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.unexpected.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |keys: &[IdempotencyKey]| keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
        write!(
            f,
            "done once {}, failure record {}, lost {} [{}], duplicated {} [{}], unexpected {} [{}]",
            self.done_once.len(),
            self.failure_record.len(),
            self.lost.len(),
            list(&self.lost),
            self.duplicated.len(),
            list(&self.duplicated),
            self.unexpected.len(),
            list(&self.unexpected),
        )
    }
}

/// A broken invariant: what was expected, and the report at that point.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The scenario.
    pub scenario: &'static str,
    /// What did not hold.
    pub message: String,
    /// The key sort, when the scenario got that far.
    pub report: Option<Box<Report>>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conformance `{}`: {}", self.scenario, self.message)?;
        if let Some(report) = &self.report {
            write!(f, "\n  keys: {report}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

/// A scenario's result.
pub type Outcome = Result<Report, Violation>;

/// Panics with the violation, for use in tests.
#[track_caller]
pub fn check(outcome: Outcome) {
    if let Err(violation) = outcome {
        panic!("{violation}");
    }
}

/// The scenario names, in order.
pub const SCENARIOS: [&str; 50] = [
    "replay",
    "race",
    "exhaust",
    "recover",
    "key_conflict",
    "undecodable",
    "oversized",
    "dead_worker",
    "stale_lease",
    "many_workers",
    "discard_and_purge",
    "graceful_shutdown",
    "stranded_claims",
    "slow_handler",
    "stalled_heartbeat",
    "busy_never_dead_letters",
    "ledger_outage",
    "provider_key_once",
    "mixed_kinds",
    "crash_loop",
    "alert_delivery",
    "no_payload_in_logs",
    "purge_forgets",
    "racing_replays",
    "reminders",
    "expired",
    "scheduled",
    "settle_retried",
    "payload_limits",
    "no_receipt_in_logs",
    "atomic_batch",
    "claim_by_kind",
    "crash_refunds",
    "max_delay",
    "not_now",
    "timeout",
    "paused_kind",
    "outage_storm",
    "rate_limited",
    "kind_concurrency",
    "key_concurrency",
    "ordered_through_failure",
    "priorities",
    "replay_failed_again",
    "amended_replay",
    "cancel",
    "cancel_running",
    "cancel_key_in_ledger",
    "trace_context",
    "forget_key",
];

/// Writes every scenario as a named `#[tokio::test]`s, each given a fresh subject from
/// `$subject` (an expression evaluating to a future of a [`Subject`]); see the crate docs.
#[macro_export]
macro_rules! suite {
    ($subject:expr) => {
        $crate::suite!(@each $subject; replay race exhaust recover key_conflict undecodable oversized
            dead_worker stale_lease many_workers discard_and_purge graceful_shutdown stranded_claims slow_handler
            stalled_heartbeat busy_never_dead_letters ledger_outage provider_key_once mixed_kinds crash_loop
            alert_delivery no_payload_in_logs purge_forgets racing_replays reminders expired scheduled
            settle_retried payload_limits no_receipt_in_logs atomic_batch claim_by_kind crash_refunds max_delay
            not_now timeout paused_kind outage_storm rate_limited kind_concurrency key_concurrency
            ordered_through_failure priorities replay_failed_again amended_replay cancel
            cancel_running cancel_key_in_ledger trace_context forget_key);
    };
    (@each $subject:expr; $($name:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::check($crate::$name($subject.await).await);
            }
        )*
    };
}

/// An open failure record as a worker writes it at the cap (five attempts, one error), with id
/// `m-<n>`, job id `j-<n>` and key `ship:parcel=<n>`: for tests of a
/// [`RecordStore`](redrive_core::kit::RecordStore) and of what reads records.
pub fn sample_record(n: u32, payload: serde_json::Value) -> redrive_core::FailureRecord {
    let now = chrono::Utc::now();
    let error = "carrier rejected the label".to_owned();
    redrive_core::FailureRecord {
        id: redrive_core::FailureId(format!("m-{n}")),
        job_id: redrive_core::JobId(format!("j-{n}")),
        kind: "ship".into(),
        key: IdempotencyKey::builder("ship").fact("parcel", n).build().expect("a valid key"),
        provider_key: redrive_core::ProviderKey::mint(),
        payload,
        errors: vec![redrive_core::kit::AttemptError { attempt: 5, at: now, error: error.clone() }],
        last_error: error,
        attempts: 5,
        cap: 5,
        severity: redrive_core::Severity::Error,
        first_failed_at: now,
        last_failed_at: now,
        state: redrive_core::RecordState::Open,
        replay_of: None,
        amended: None,
        trace_id: None,
    }
}
