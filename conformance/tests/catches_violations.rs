//! The suite is only worth something if it fails on a broken backend. These wrap the in-memory
//! backend with faults and check that each scenario reports them.
//!
//! `stalled_heartbeat` has no broken backend here: whatever a backend does with a renewal that
//! hangs, the worker cancels the handler before its hold lapses, so what it checks is the worker
//! (`core/src/worker/tests.rs` breaks that on purpose).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_conformance::{Subject, Timing};
use redrive_core::kit::{
    Backend, Begin, Capabilities, Claim, Claimed, Hold, Kinds, Lease, Ledger, Renew, require_audit,
};
use redrive_core::{
    CancelOutcome, DeadLetter, Enqueue, Enqueued, Error, ErrorKind, FailureId, FailureQuery, FailureRecord,
    IdempotencyKey, JobId, JobQuery, Jobs, LiveJob, MemoryBackend, NewJob, ProviderKey, RecordState, Replay,
    ReplayOutcome, Result,
};
use serde_json::Value;

/// The in-memory backend with some faults, the jobs it handed out (by lease token), and the
/// times of the jobs it keeps apart from them (by key).
#[derive(Clone)]
struct Broken(
    MemoryBackend,
    &'static [Fault],
    Arc<Mutex<HashMap<String, Claimed>>>,
    Arc<Mutex<HashMap<IdempotencyKey, DateTime<Utc>>>>,
);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Enqueue counts a payload's characters, not its bytes, against the declared limit, and the
    /// store behind takes what it is given: a multibyte character across the limit gets in.
    CountsCharacters,
    /// Enqueue writes characters a broker refuses (NUL, U+FFFE, U+FFFF) as U+FFFD, as a lossy
    /// encoder would: the job runs with another payload.
    ReplacesAwkward,
    /// A payload of exactly the declared limit is answered as created and never stored, as a
    /// broker that counts its envelope in the limit and drops the message would.
    DropsAtLimit,
    /// A settlement with a lease that is no longer the job's quotes the lease's token in its
    /// error, as a broker's error echoing the receipt handle would.
    ErrorQuotesToken,
    /// Each claim is logged with its receipt.
    LogsToken,
    /// Acknowledgements are lost: `complete` answers Ok and changes nothing, so every job comes
    /// back after its lease, as on a broker whose delete failed silently.
    AckLost,
    /// Claims ignore the lease asked for and hold jobs eight times as long, as a backend with a
    /// fixed visibility timeout would.
    FixedLease,
    /// Claims and renewals hold jobs a quarter of the time asked: jobs come back while they run.
    ShortLease,
    /// The ledger's holds cannot be extended: a key is held for the first lease only.
    HoldNotExtended,
    /// A deferral is a failed attempt: it counts, and writes an error.
    DeferIsRetry,
    /// A deferral ends the job as a failure record.
    DeferDeadLetters,
    /// Claims take every kind, whatever the worker asked for.
    IgnoresKinds,
    /// A renewal extends nothing and never marks the job started: every lapse is refunded.
    RenewalsLie,
    /// A resumed key gets a provider key of its own.
    NewProviderKeyOnResume,
    /// The failure record's error quotes the payload.
    ErrorQuotesPayload,
    /// `purge` answers as if it had deleted, and deletes nothing.
    PurgeKeepsAll,
    /// `replay` sends the job whatever the record's state, as a read-check-send replay does when
    /// two run at once.
    ReplayUnchecked,
    /// A discard with a blank reason is accepted (as the command's was).
    DiscardWithoutReason,
    /// A replayed record reads without who replayed it and why, as a store without the columns
    /// would keep it.
    ReplayForgetsWho,
    /// A batch is enqueued one job at a time and stops at the first refusal: the jobs before it
    /// stay, as a broker's batch call that is not a transaction leaves them.
    BatchOneByOne,
    /// Each claim marks its jobs started at once: a claim that lapses before its handler started
    /// is charged, as on a queue that counts receives.
    ClaimsStart,
    /// Enqueue drops a job's time: a scheduled job is ready at once, and claimed without it.
    IgnoresSchedule,
    /// Not a fault: enqueue keeps a job's time apart and makes the job ready at once; claims
    /// carry the time, as a broker's past its delay cap do, for the worker to wait.
    WorkerSchedules,
    /// Each claim says the job was enqueued just now, as a broker that stamps a deferral's copy
    /// with the time it was sent would: a job's age starts again at every deferral.
    ForgetsAge,
    /// `release_hold` does nothing: a key stays held until its hold lapses.
    HoldKept,
    /// Not a fault: declares what a broker does (no atomic batch, no claim by kind, no crash
    /// refunds, no delay of its own, no order per key, no priorities, refusing order keys and
    /// priorities), so that the suite holds it to less.
    DeclaresLess,
    /// Enqueue drops a job's order key: jobs of one key run at once, and past a failed one.
    IgnoresOrder,
    /// Declares no order per key and no priorities, yet takes jobs with an order key or a
    /// priority and runs them unordered.
    AcceptsUnordered,
    /// A replayed record reads as confirmed as soon as it is replayed, before its job ran (what
    /// the dashboard and command showed before replays were confirmed by their effect).
    ConfirmsAtSend,
    /// A replayed record reads as confirmed whatever its job came to: a replay that failed
    /// again closes the incident.
    ConfirmsFailures,
    /// An amended replay replays the record's own payload, dropping the correction.
    AmendIgnored,
    /// A cancel answers as if it had cancelled, and leaves the job queued: it runs.
    CancelIgnored,
    /// Declares no live jobs (`DeclaresLess`), yet lists and cancels them.
    ListsAnyway,
    /// A running job's cancel is kept, yet its renewal answers as if renewed: the handler is
    /// never told to stop.
    StopIgnored,
    /// The ledger answers a cancel of a key as done, and keeps nothing: its message runs.
    LedgerCancelIgnored,
    /// Enqueue drops a job's priority: claims take the jobs oldest first, whatever their priority.
    IgnoresPriority,
    /// Enqueue drops a job's trace context, as a store without the column would: handlers get
    /// none, and records keep no trace id.
    DropsTraceparent,
    /// A record reads back without its trace id, as a record read without the column would.
    RecordForgetsTrace,
    /// A dead letter keeps the trace of the job as it was claimed, not as it was handed over:
    /// the failing attempt's trace (with the `otel` feature) is lost.
    TracesAsClaimed,
}

impl Broken {
    fn new(backend: MemoryBackend, faults: &'static [Fault]) -> Self {
        Self(backend, faults, Arc::default(), Arc::default())
    }

    fn has(&self, fault: Fault) -> bool {
        self.1.contains(&fault)
    }
}

/// The limit a [`Broken`] declares: the memory backend's default.
const DECLARED: usize = 256 * 1024;

impl Backend for Broken {
    fn capabilities(&self) -> Capabilities {
        let declared = Capabilities { max_payload: DECLARED, ..self.0.capabilities() };
        if !self.has(Fault::DeclaresLess) {
            return declared;
        }
        Capabilities {
            atomic_batch: false,
            claim_by_kind: false,
            crash_refunds: false,
            max_delay: None,
            order_per_key: false,
            live_jobs: false,
            priorities: false,
            ..declared
        }
    }
}

impl Broken {
    /// The job as the broken enqueue stores it; `None`: it answers created and drops it.
    fn mangle(&self, mut job: NewJob) -> Result<Option<NewJob>> {
        if self.has(Fault::CountsCharacters) && job.payload.to_string().chars().count() > DECLARED {
            return Err(redrive_core::Error::new(redrive_core::ErrorKind::PayloadTooLarge, "too many characters"));
        }
        if self.has(Fault::DropsAtLimit) && job.payload_len() == DECLARED {
            return Ok(None);
        }
        if self.has(Fault::ReplacesAwkward)
            && let Some(Value::String(body)) = job.payload.get_mut("body")
        {
            *body = body.replace(['\u{0}', '\u{FFFE}', '\u{FFFF}'], "\u{FFFD}");
        }
        if self.has(Fault::WorkerSchedules)
            && let Some(at) = job.not_before
        {
            self.3.lock().unwrap().insert(job.key.clone(), at);
        }
        if self.has(Fault::IgnoresSchedule) || self.has(Fault::WorkerSchedules) {
            job.not_before = None;
        }
        if self.has(Fault::IgnoresOrder) {
            job.order_key = None;
        }
        if self.has(Fault::IgnoresPriority) {
            job.priority = 0;
        }
        if !self.has(Fault::AcceptsUnordered) {
            // The order and priority checks alone: the size is the other faults' business.
            job.check_fits(&Capabilities { max_payload: usize::MAX, ..self.capabilities() })?;
        }
        if self.has(Fault::DropsTraceparent) {
            // Checked, then not stored.
            job.traceparent = None;
        }
        Ok(Some(job))
    }
}

impl Enqueue for Broken {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        match self.mangle(job.clone())? {
            Some(job) => self.0.enqueue(job).await,
            None => Ok(Enqueued::Created(redrive_core::JobId("dropped".into()))),
        }
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let mut kept = Vec::new();
        for job in jobs {
            kept.extend(self.mangle(job)?);
        }
        if self.has(Fault::BatchOneByOne) {
            let mut answers = Vec::new();
            for job in kept {
                answers.push(self.0.enqueue(job).await?);
            }
            return Ok(answers);
        }
        self.0.enqueue_batch(kept).await
    }
}

impl Claim for Broken {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let lease = match () {
            () if self.has(Fault::FixedLease) => lease * 8,
            () if self.has(Fault::ShortLease) => lease / 4,
            () => lease,
        };
        let kinds = if self.has(Fault::IgnoresKinds) { &Kinds::Any } else { kinds };
        let mut claimed = self.0.claim(kinds, max, lease, wait).await?;
        if self.has(Fault::WorkerSchedules) {
            for c in &mut claimed {
                c.job.not_before = self.3.lock().unwrap().get(&c.job.key).copied();
            }
        }
        if self.has(Fault::ForgetsAge) {
            for c in &mut claimed {
                c.job.enqueued_at = Utc::now();
            }
        }
        if self.has(Fault::ClaimsStart) {
            for c in &claimed {
                self.0.renew(&c.lease, lease).await?;
            }
        }
        let mut handed = self.2.lock().unwrap();
        for c in &claimed {
            if self.has(Fault::LogsToken) {
                tracing::warn!(job = %c.lease.job_id, receipt = %c.lease.token, "claimed");
            }
            handed.insert(c.lease.token.clone(), c.clone());
        }
        Ok(claimed)
    }
    async fn complete(&self, lease: &Lease, result: Option<&Value>) -> Result<()> {
        if self.has(Fault::AckLost) {
            return Ok(());
        }
        let completed = self.0.complete(lease, result).await;
        if self.has(Fault::ErrorQuotesToken)
            && let Err(e) = &completed
        {
            return Err(redrive_core::Error::new(e.kind(), format!("receipt {} is not current", lease.token)));
        }
        completed
    }
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        self.0.retry(lease, delay, error).await
    }
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        if self.has(Fault::DeferIsRetry) {
            return self.0.retry(lease, delay, "deferred").await;
        }
        if self.has(Fault::DeferDeadLetters) {
            let claimed = self.2.lock().unwrap().get(&lease.token).cloned().expect("a job claimed here");
            return self.0.dead_letter(&claimed, "deferred").await.map(|_| ());
        }
        self.0.defer(lease, delay).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn dead_letter(&self, job: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        if self.has(Fault::TracesAsClaimed) {
            let claimed = self.2.lock().unwrap().get(&job.lease.token).cloned().expect("a job claimed here");
            return self.0.dead_letter(&claimed, error).await;
        }
        if self.has(Fault::ErrorQuotesPayload) {
            return self.0.dead_letter(job, &format!("{error}: {}", job.job.payload)).await;
        }
        self.0.dead_letter(job, error).await
    }
    async fn confirm_replay(&self, record: &FailureId) -> Result<()> {
        self.0.confirm_replay(record).await
    }
    async fn withdraw_replay(&self, record: &FailureId, cancel: &redrive_core::Cancellation) -> Result<()> {
        self.0.withdraw_replay(record, cancel).await
    }
    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for Broken {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        if self.has(Fault::RenewalsLie) {
            return Ok(lease.clone());
        }
        if self.has(Fault::StopIgnored) {
            return match self.0.renew(lease, by).await {
                Err(e) if e.kind() == redrive_core::ErrorKind::Cancelled => Ok(lease.clone()),
                other => other,
            };
        }
        let by = if self.has(Fault::ShortLease) { by / 4 } else { by };
        self.0.renew(lease, by).await
    }
}

impl Broken {
    /// `record` as this backend reads it back.
    fn stored(&self, mut record: FailureRecord) -> FailureRecord {
        if self.has(Fault::RecordForgetsTrace) {
            record.trace_id = None;
        }
        if self.has(Fault::ReplayForgetsWho)
            && let RecordState::Replaying { reason, actor, .. } | RecordState::Confirmed { reason, actor, .. } =
                &mut record.state
        {
            reason.clear();
            actor.clear();
        }
        let confirmed = |state: &RecordState| state.confirmed(Utc::now());
        if self.has(Fault::ConfirmsAtSend)
            && let Some(confirmed) = confirmed(&record.state)
        {
            record.state = confirmed;
        }
        if self.has(Fault::ConfirmsFailures)
            && let RecordState::FailedAgain { at, reason, actor, amended, .. } = record.state.clone()
        {
            record.state = RecordState::Confirmed { at, reason, actor, amended, confirmed_at: Utc::now() };
        }
        record
    }
}

impl DeadLetter for Broken {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        Ok(self.0.list(query).await?.into_iter().map(|r| self.stored(r)).collect())
    }
    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        Ok(self.stored(self.0.get(id).await?))
    }
    async fn count_open(&self) -> Result<u64> {
        self.0.count_open().await
    }
    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        if self.has(Fault::DiscardWithoutReason) && reason.trim().is_empty() {
            return self.0.discard(id, "(none given)", actor).await;
        }
        self.0.discard(id, reason, actor).await
    }
    async fn purge(&self, age: Duration) -> Result<u64> {
        if self.has(Fault::PurgeKeepsAll) {
            return Ok(self.0.list(&FailureQuery::default()).await?.len() as u64);
        }
        self.0.purge(age).await
    }
    async fn blocked(&self) -> Result<Vec<redrive_core::Blocked>> {
        self.0.blocked().await
    }
}

impl Broken {
    /// Whether it refuses live jobs, as it declares.
    fn unlisted(&self) -> Result<()> {
        if self.has(Fault::DeclaresLess) && !self.has(Fault::ListsAnyway) {
            return Err(Error::new(ErrorKind::Unsupported, "declared: no live jobs"));
        }
        Ok(())
    }
}

impl Jobs for Broken {
    async fn list_jobs(&self, query: &JobQuery) -> Result<Vec<LiveJob>> {
        self.unlisted()?;
        self.0.list_jobs(query).await
    }

    async fn get_job(&self, id: &JobId) -> Result<LiveJob> {
        self.unlisted()?;
        self.0.get_job(id).await
    }

    async fn cancel_job(&self, id: &JobId, reason: &str, actor: &str) -> Result<CancelOutcome> {
        self.unlisted()?;
        if self.has(Fault::CancelIgnored) {
            redrive_core::kit::require_cancel_audit(reason, actor)?;
            self.0.get_job(id).await?;
            return Ok(CancelOutcome::Cancelled);
        }
        self.0.cancel_job(id, reason, actor).await
    }
}

impl Replay for Broken {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        match self.0.replay(id, reason, actor).await? {
            ReplayOutcome::AlreadyClosed(_) if self.has(Fault::ReplayUnchecked) => {
                let record = self.0.get(id).await?;
                Ok(ReplayOutcome::Replayed(record.job_id))
            }
            outcome => Ok(outcome),
        }
    }
    async fn replay_amended(
        &self,
        id: &FailureId,
        payload: &Value,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        if self.has(Fault::AmendIgnored) {
            require_audit("an amended replay's reason", reason)?;
            return self.0.replay(id, reason, actor).await;
        }
        self.0.replay_amended(id, payload, reason, actor).await
    }
}

impl Ledger for Broken {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let begin = self.0.begin(key, payload, provider_key, hold).await?;
        Ok(match begin {
            Begin::Resumed(hold) if self.has(Fault::NewProviderKeyOnResume) => {
                Begin::Resumed(Hold { provider_key: ProviderKey::mint(), ..hold })
            }
            other => other,
        })
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        if self.has(Fault::HoldNotExtended) {
            return Ok(());
        }
        self.0.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        if self.has(Fault::HoldKept) {
            return Ok(());
        }
        self.0.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        self.0.finish(hold, result).await
    }
    async fn cancel_effect(&self, key: &IdempotencyKey, reason: &str, actor: &str) -> Result<CancelOutcome> {
        if self.has(Fault::LedgerCancelIgnored) {
            redrive_core::kit::require_cancel_audit(reason, actor)?;
            return Ok(CancelOutcome::Cancelled);
        }
        self.0.cancel_effect(key, reason, actor).await
    }
}

/// An effect ledger that remembers nothing: every attempt is fresh.
#[derive(Clone)]
struct Amnesiac;

impl Ledger for Amnesiac {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        _payload: &Value,
        provider_key: ProviderKey,
        _hold: Duration,
    ) -> Result<Begin> {
        Ok(Begin::Fresh(Hold { key: key.clone(), token: "any".into(), provider_key, lease: None }))
    }
    async fn extend_hold(&self, _hold: &Hold, _by: Duration) -> Result<()> {
        Ok(())
    }
    async fn release_hold(&self, _hold: &Hold) -> Result<()> {
        Ok(())
    }
    async fn finish(&self, _hold: &Hold, _result: &Value) -> Result<()> {
        Ok(())
    }
}

fn timing() -> Timing {
    Timing { lease: Duration::from_millis(300), settle: Duration::from_millis(1200), ..Timing::default() }
}

/// The memory backend broken by `faults`, as queue and ledger.
fn broken(faults: &'static [Fault], timing: Timing) -> Subject<Broken, Broken> {
    let backend = Broken::new(MemoryBackend::new(), faults);
    let probe = backend.0.clone();
    Subject::new(backend.clone(), backend, timing).storage(move |text| {
        let probe = probe.clone();
        async move { probe.holds_text(&text) }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acks_without_a_ledger_are_caught_as_duplicated() {
    let queue = Broken::new(MemoryBackend::new(), &[Fault::AckLost]);
    let violation = redrive_conformance::replay(Subject::new(queue, Amnesiac, timing())).await.unwrap_err();
    let report = violation.report.expect("the scenario got as far as the key sort");
    assert_eq!(
        report.duplicated,
        [IdempotencyKey::builder("redrive_conformance_probe").fact("id", 1).build().unwrap()]
    );
    assert!(report.done_once.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_alone_keeps_lost_acks_to_one_effect() {
    let backend = MemoryBackend::new();
    let queue = Broken::new(backend.clone(), &[Fault::AckLost]);
    let report = redrive_conformance::replay(Subject::new(queue, backend, timing())).await.unwrap();
    assert_eq!(report.done_once.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_forgets_fails_the_race() {
    let backend = MemoryBackend::new();
    let violation = redrive_conformance::race(Subject::new(backend, Amnesiac, timing())).await.unwrap_err();
    assert!(violation.message.contains("exactly one racing attempt"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_holds_claims_for_the_whole_lease_fails_stranded_claims() {
    let backend = MemoryBackend::new();
    let queue = Broken::new(backend.clone(), &[Fault::FixedLease]);
    let timing = Timing { lease: Duration::from_millis(500), ..timing() };
    let violation = redrive_conformance::stranded_claims(Subject::new(queue, backend, timing)).await.unwrap_err();
    assert!(violation.message.contains("claimed ahead and never started"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_whose_holds_lapse_under_a_slow_handler_fails_slow_handler() {
    let backend = MemoryBackend::new();
    let ledger = Broken::new(backend.clone(), &[Fault::HoldNotExtended]);
    let timing = Timing { lease: Duration::from_secs(1), ..timing() };
    let violation = redrive_conformance::slow_handler(Subject::new(backend, ledger, timing)).await.unwrap_err();
    assert!(violation.message.contains("with the heartbeat off, the slow handler started"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferrals_that_count_as_attempts_fail_busy_never_dead_letters() {
    // Short leases make the running job come back to the second worker, which must wait.
    let subject = broken(&[Fault::ShortLease, Fault::DeferIsRetry], timing());
    let violation = redrive_conformance::busy_never_dead_letters(subject).await.unwrap_err();
    // The waiting delivery spent its attempts: it ends as a record (or never runs).
    assert!(violation.to_string().contains("record") || violation.message.contains("effects"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferrals_that_count_as_attempts_fail_ledger_outage() {
    let violation = redrive_conformance::ledger_outage(broken(&[Fault::DeferIsRetry], timing())).await.unwrap_err();
    // Attempts spent on the outage: jobs (cap 2) end as records and never run.
    assert!(violation.message.contains("spend no attempt") || violation.message.contains("effects"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_mints_a_new_provider_key_fails_provider_key_once() {
    let subject = broken(&[Fault::NewProviderKeyOnResume], timing());
    let violation = redrive_conformance::provider_key_once(subject).await.unwrap_err();
    assert!(violation.message.contains("one provider key"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_every_kind_whose_deferral_dead_letters_fail_mixed_kinds() {
    let subject = broken(&[Fault::IgnoresKinds, Fault::DeferDeadLetters], timing());
    let violation = redrive_conformance::mixed_kinds(subject).await.unwrap_err();
    // The other workers' jobs end as records: they never run.
    assert!(violation.message.contains("effects") || violation.message.contains("records"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refunds_every_crash_fails_crash_loop() {
    let violation = redrive_conformance::crash_loop(broken(&[Fault::RenewalsLie], timing())).await.unwrap_err();
    assert!(violation.message.contains("should end as a record"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_forgets_sent_alerts_fails_alert_delivery() {
    let backend = MemoryBackend::new();
    let violation = redrive_conformance::alert_delivery(Subject::new(backend, Amnesiac, timing())).await.unwrap_err();
    assert!(violation.message.contains("one alert per record"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_quoting_the_payload_fails_no_payload_in_logs() {
    let subject = broken(&[Fault::ErrorQuotesPayload], timing());
    let violation = redrive_conformance::no_payload_in_logs(subject).await.unwrap_err();
    assert!(violation.message.contains("quotes the payload") || violation.message.contains("log"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_that_keeps_payloads_fails_purge_forgets() {
    let violation = redrive_conformance::purge_forgets(broken(&[Fault::PurgeKeepsAll], timing())).await.unwrap_err();
    assert!(violation.message.contains("nowhere"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_that_keeps_the_record_fails_forget_key() {
    // Answers that it forgot the record, and forgets nothing.
    let subject =
        broken(&[], timing()).forget(|_key| async { Ok(redrive_core::Forgotten { jobs: 1, records: 1, ledger: 1 }) });
    let violation = redrive_conformance::forget_key(subject).await.unwrap_err();
    assert!(violation.message.contains("nowhere"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_that_keeps_the_key_taken_fails_forget_key() {
    // Purges the records (which frees a failed key), but keeps a done key's ledger entry.
    let backend = MemoryBackend::new();
    let store = backend.clone();
    let subject = Subject::new(backend.clone(), backend.clone(), timing())
        .storage(move |text| {
            let probe = store.clone();
            async move { probe.holds_text(&text) }
        })
        .forget(move |_key| {
            let backend = backend.clone();
            async move {
                let purged = redrive_core::DeadLetter::purge(&backend, Duration::ZERO).await?;
                Ok(redrive_core::Forgotten { jobs: 0, records: purged, ledger: 0 })
            }
        });
    let violation = redrive_conformance::forget_key(subject).await.unwrap_err();
    assert!(violation.message.contains("done key") || violation.message.contains("free to begin"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_does_not_check_the_record_fails_racing_replays() {
    let violation = redrive_conformance::racing_replays(broken(&[Fault::ReplayUnchecked], timing())).await.unwrap_err();
    assert!(violation.message.contains("put the job back once"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_be_kept_while_a_completion_is_retried_fails_settle_retried() {
    // Renewals that extend nothing: the job's lease lapses while its refused completion is tried
    // again, and it is claimed a second time (the same fault a worker that gives up shows).
    let violation = redrive_conformance::settle_retried(broken(&[Fault::RenewalsLie], timing())).await.unwrap_err();
    assert!(violation.message.contains("claimed again"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_without_a_reason_fails_discard_and_purge() {
    let subject = broken(&[Fault::DiscardWithoutReason], timing());
    let violation = redrive_conformance::discard_and_purge(subject).await.unwrap_err();
    assert!(violation.message.contains("should be refused as InvalidInput"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_forgets_who_fails_recover() {
    let violation = redrive_conformance::recover(broken(&[Fault::ReplayForgetsWho], timing())).await.unwrap_err();
    assert!(violation.message.contains("replayed by ops@example.com"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_confirmed_when_the_replay_is_sent_fails_recover() {
    let violation = redrive_conformance::recover(broken(&[Fault::ConfirmsAtSend], timing())).await.unwrap_err();
    assert!(violation.message.contains("should be replaying until its job's effect is done"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_failed_again_read_as_confirmed_fails_replay_failed_again() {
    let subject = broken(&[Fault::ConfirmsFailures], timing());
    let violation = redrive_conformance::replay_failed_again(subject).await.unwrap_err();
    assert!(violation.message.contains("should say its job failed again into record"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amended_replay_that_drops_the_correction_fails_amended_replay() {
    let violation = redrive_conformance::amended_replay(broken(&[Fault::AmendIgnored], timing())).await.unwrap_err();
    assert!(violation.message.contains("timed out waiting for 1 effect"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_keeps_the_jobs_before_a_refusal_fails_atomic_batch() {
    let violation = redrive_conformance::atomic_batch(broken(&[Fault::BatchOneByOne], timing())).await.unwrap_err();
    assert!(violation.message.contains("stores all of a batch or none"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_every_kind_fail_claim_by_kind() {
    let violation = redrive_conformance::claim_by_kind(broken(&[Fault::IgnoresKinds], timing())).await.unwrap_err();
    assert!(violation.message.contains("takes only the kinds asked for"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_charged_when_they_lapse_unstarted_fail_crash_refunds() {
    let violation = redrive_conformance::crash_refunds(broken(&[Fault::ClaimsStart], timing())).await.unwrap_err();
    assert!(violation.message.contains("declares crash_refunds gives the attempt back"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_dropped_at_enqueue_fails_max_delay() {
    let violation = redrive_conformance::max_delay(broken(&[Fault::IgnoresSchedule], timing())).await.unwrap_err();
    assert!(violation.message.contains("the backend holds such a job back itself"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_dropped_where_the_worker_waits_fails_max_delay() {
    let subject = broken(&[Fault::DeclaresLess, Fault::IgnoresSchedule], timing());
    let violation = redrive_conformance::max_delay(subject).await.unwrap_err();
    assert!(violation.message.contains("the worker cannot put it back"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_declares_less_is_held_to_less() {
    let less = |fault| broken(Box::leak(Box::new([Fault::DeclaresLess, fault])), timing());
    redrive_conformance::check(redrive_conformance::atomic_batch(less(Fault::BatchOneByOne)).await);
    redrive_conformance::check(redrive_conformance::claim_by_kind(less(Fault::IgnoresKinds)).await);
    redrive_conformance::check(redrive_conformance::crash_refunds(less(Fault::ClaimsStart)).await);
    redrive_conformance::check(redrive_conformance::max_delay(less(Fault::WorkerSchedules)).await);
    redrive_conformance::check(redrive_conformance::ordered_through_failure(less(Fault::DeclaresLess)).await);
    redrive_conformance::check(redrive_conformance::cancel(less(Fault::DeclaresLess)).await);
    redrive_conformance::check(redrive_conformance::priorities(less(Fault::DeclaresLess)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_leaves_the_job_queued_fails_cancel() {
    let violation = redrive_conformance::cancel(broken(&[Fault::CancelIgnored], timing())).await.unwrap_err();
    assert!(violation.message.contains("a second cancel should change nothing"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_never_told_to_stop_fails_cancel_running() {
    let violation = redrive_conformance::cancel_running(broken(&[Fault::StopIgnored], timing())).await.unwrap_err();
    assert!(
        ["to end cancelled", "was not stopped", "should be refused as Cancelled"]
            .iter()
            .any(|m| violation.message.contains(m)),
        "{violation}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_cancel_that_keeps_nothing_fails_cancel_key_in_ledger() {
    let subject = broken(&[Fault::DeclaresLess, Fault::LedgerCancelIgnored], timing());
    let violation = redrive_conformance::cancel_key_in_ledger(subject).await.unwrap_err();
    assert!(violation.message.contains("a second cancel should change nothing"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_declares_less_gets_a_ledger_cancel_that_holds() {
    let subject = broken(&[Fault::DeclaresLess], timing());
    redrive_conformance::check(redrive_conformance::cancel_key_in_ledger(subject).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_jobs_while_declaring_none_fails_cancel() {
    let subject = broken(&[Fault::DeclaresLess, Fault::ListsAnyway], timing());
    let violation = redrive_conformance::cancel(subject).await.unwrap_err();
    assert!(violation.message.contains("refused as Unsupported"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_the_order_key_fails_ordered_through_failure() {
    let violation =
        redrive_conformance::ordered_through_failure(broken(&[Fault::IgnoresOrder], timing())).await.unwrap_err();
    assert!(violation.message.contains("overtook an earlier one that failed"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_order_keys_without_keeping_order_fails_ordered_through_failure() {
    let subject = broken(&[Fault::DeclaresLess, Fault::AcceptsUnordered], timing());
    let violation = redrive_conformance::ordered_through_failure(subject).await.unwrap_err();
    assert!(violation.message.contains("should be refused with InvalidInput"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_priorities_fails_priorities() {
    let violation = redrive_conformance::priorities(broken(&[Fault::IgnoresPriority], timing())).await.unwrap_err();
    assert!(violation.message.contains("should start by priority"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_priorities_without_keeping_them_fails_priorities() {
    let subject = broken(&[Fault::DeclaresLess, Fault::AcceptsUnordered], timing());
    let violation = redrive_conformance::priorities(subject).await.unwrap_err();
    assert!(violation.message.contains("should be refused with InvalidInput"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_traceparent_fails_trace_context() {
    let violation = redrive_conformance::trace_context(broken(&[Fault::DropsTraceparent], timing())).await.unwrap_err();
    assert!(violation.message.contains("should see the traceparent it was enqueued with"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_keeps_the_claimed_trace_fails_trace_context() {
    let violation = redrive_conformance::trace_context(broken(&[Fault::TracesAsClaimed], timing())).await.unwrap_err();
    assert!(violation.message.contains("the failing attempt's, in place of its producer's"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_read_without_its_trace_id_fails_trace_context() {
    let violation =
        redrive_conformance::trace_context(broken(&[Fault::RecordForgetsTrace], timing())).await.unwrap_err();
    assert!(violation.message.contains("should keep its trace id"), "{violation}");
}

/// The memory backend behind a [`Broken`] takes payloads four times the declared limit, so that
/// what the broken enqueue lets through is stored.
fn broken_roomy(faults: &'static [Fault]) -> Subject<Broken, Broken> {
    let backend = Broken::new(MemoryBackend::with_max_payload(DECLARED * 4), faults);
    Subject::new(backend.clone(), backend, timing())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_characters_not_bytes_fails_payload_limits() {
    let violation = redrive_conformance::payload_limits(broken_roomy(&[Fault::CountsCharacters])).await.unwrap_err();
    assert!(violation.message.contains("should be refused with PayloadTooLarge"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_awkward_characters_fails_payload_limits() {
    let violation = redrive_conformance::payload_limits(broken(&[Fault::ReplacesAwkward], timing())).await.unwrap_err();
    assert!(violation.message.contains("reached the handler changed"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_payload_at_the_limit_fails_payload_limits() {
    let timing = Timing { timeout: Duration::from_secs(5), ..timing() };
    let backend = Broken::new(MemoryBackend::new(), &[Fault::DropsAtLimit]);
    let violation =
        redrive_conformance::payload_limits(Subject::new(backend.clone(), backend, timing)).await.unwrap_err();
    assert!(violation.message.contains("timed out waiting for"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_quoting_a_receipt_fails_no_receipt_in_logs() {
    let violation =
        redrive_conformance::no_receipt_in_logs(broken(&[Fault::ErrorQuotesToken], timing())).await.unwrap_err();
    assert!(violation.message.contains("an error quotes a lease token"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_in_a_log_line_fails_no_receipt_in_logs() {
    let violation = redrive_conformance::no_receipt_in_logs(broken(&[Fault::LogsToken], timing())).await.unwrap_err();
    assert!(violation.message.contains("written to the log"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferrals_that_count_as_attempts_fail_not_now() {
    let violation = redrive_conformance::not_now(broken(&[Fault::DeferIsRetry], timing())).await.unwrap_err();
    // A "not now" spent an attempt: the job with a cap of 2 ran attempt 2, and ended as a record.
    assert!(violation.message.contains("costs no attempt"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferral_that_forgets_the_jobs_age_fails_not_now() {
    let timing = Timing { timeout: Duration::from_secs(5), ..timing() };
    let violation = redrive_conformance::not_now(broken(&[Fault::ForgetsAge], timing)).await.unwrap_err();
    assert!(violation.message.contains("lets it wait for ever"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_kept_after_a_timeout_fails_timeout() {
    let violation = redrive_conformance::timeout(broken(&[Fault::HoldKept], timing())).await.unwrap_err();
    assert!(violation.message.contains("releases the key's hold"), "{violation}");
}
