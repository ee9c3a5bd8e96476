//! The scenarios' moving parts: the probe job, the scripted handler, the effect log (no unique
//! constraint on purpose) and the alert log.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::alert::BoxFuture;
use redrive_core::{
    Alert, AlertSink, Backoff, Begin, Claim, Claimed, Enqueue, Enqueued, FailureQuery, FailureRecord, Hold,
    IdempotencyKey, Job, JobContext, JobError, KeyBuilder, Lease, Ledger, NewJob, ProviderKey, RunningWorker, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};

use crate::{Queue, Report, Subject, Violation};

/// The job kind every scenario enqueues.
pub const PROBE_KIND: &str = "redrive_conformance_probe";

/// The job every scenario enqueues: its key is its `id`; `body` varies the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The business fact the key derives from.
    pub id: u32,
    /// Anything; differs between payloads that share a key.
    pub body: String,
}

impl Job for Probe {
    const KIND: &'static str = PROBE_KIND;
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("id", self.id)
    }
}

impl Probe {
    pub(crate) fn new(id: u32) -> Self {
        Self { id, body: format!("probe {id}") }
    }

    pub(crate) fn key(id: u32) -> IdempotencyKey {
        IdempotencyKey::builder(PROBE_KIND).fact("id", id).build().expect("a valid probe key")
    }

    pub(crate) fn new_job(&self) -> NewJob {
        NewJob::from_job(self).expect("a probe always makes a job")
    }
}

/// One effect, as the handler performed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The job's key.
    pub key: IdempotencyKey,
    /// The payload's body.
    pub body: String,
    /// The provider key the handler was given.
    pub provider_key: ProviderKey,
    /// The attempt that did it.
    pub attempt: u32,
    /// Whether the handler was told an earlier attempt was left pending.
    pub earlier_attempt_pending: bool,
}

/// How the handler misbehaves for one probe id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Fails with a retryable error on every attempt.
    Always,
    /// Fails with a permanent error.
    Permanent,
    /// Fails the first `n` attempts, then succeeds.
    First(u32),
    /// Never returns on the first attempt (its worker is then killed); succeeds after that.
    HangFirst,
}

#[derive(Default)]
pub(crate) struct Script {
    faults: Mutex<HashMap<u32, Fault>>,
    delay: Mutex<Duration>,
    /// Every handler start: (key, attempt). Includes failed attempts.
    pub(crate) starts: Mutex<Vec<(IdempotencyKey, u32)>>,
    /// Every effect performed. No unique constraint.
    pub(crate) effects: Mutex<Vec<Effect>>,
    pub(crate) alerts: Mutex<Vec<Alert>>,
}

impl Script {
    pub(crate) fn fault(&self, id: u32, fault: Fault) {
        self.faults.lock().unwrap().insert(id, fault);
    }

    pub(crate) fn heal(&self) {
        self.faults.lock().unwrap().clear();
    }

    pub(crate) fn delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    pub(crate) fn effects_of(&self, key: &IdempotencyKey) -> Vec<Effect> {
        self.effects.lock().unwrap().iter().filter(|e| e.key == *key).cloned().collect()
    }

    pub(crate) fn effect_count(&self) -> usize {
        self.effects.lock().unwrap().len()
    }

    pub(crate) fn starts_of(&self, key: &IdempotencyKey) -> Vec<u32> {
        self.starts.lock().unwrap().iter().filter(|(k, _)| k == key).map(|(_, a)| *a).collect()
    }

    pub(crate) fn alert_count(&self) -> usize {
        self.alerts.lock().unwrap().len()
    }

    async fn handle(&self, job: Probe, ctx: JobContext) -> Result<u32, JobError> {
        self.starts.lock().unwrap().push((ctx.key.clone(), ctx.attempt));
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let fault = self.faults.lock().unwrap().get(&job.id).copied();
        match fault {
            Some(Fault::Always) => return Err(JobError::retry(format!("forced failure of probe {}", job.id))),
            Some(Fault::Permanent) => {
                return Err(JobError::permanent(format!("forced permanent failure of probe {}", job.id)));
            }
            Some(Fault::First(n)) if ctx.attempt <= n => return Err(JobError::retry("forced transient failure")),
            Some(Fault::HangFirst) if ctx.attempt == 1 => std::future::pending::<()>().await,
            _ => {}
        }
        self.effects.lock().unwrap().push(Effect {
            key: ctx.key,
            body: job.body,
            provider_key: ctx.provider_key,
            attempt: ctx.attempt,
            earlier_attempt_pending: ctx.earlier_attempt_pending,
        });
        Ok(job.id)
    }
}

struct AlertLog(Arc<Script>);

impl AlertSink for AlertLog {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

/// One scenario's run: the subject, the script and the checks.
pub(crate) struct Run<Q, L> {
    pub(crate) name: &'static str,
    pub(crate) s: Subject<Q, L>,
    pub(crate) script: Arc<Script>,
}

impl<Q: Queue, L: Ledger + Clone + 'static> Run<Q, L> {
    pub(crate) fn new(name: &'static str, s: Subject<Q, L>) -> Self {
        Self { name, s, script: Arc::default() }
    }

    pub(crate) fn fail(&self, message: impl Into<String>) -> Violation {
        Violation { scenario: self.name, message: message.into(), report: None }
    }

    /// Unwraps a backend call or names it in a violation.
    pub(crate) fn must<T>(&self, what: &str, result: redrive_core::Result<T>) -> Result<T, Violation> {
        result.map_err(|e| self.fail(format!("{what} failed: {e}")))
    }

    /// A worker with the scenario settings: the subject's lease, no backoff.
    pub(crate) fn worker(&self, concurrency: usize) -> RunningWorker {
        self.worker_with(concurrency, self.s.caps.lease, Duration::from_secs(30))
    }

    pub(crate) fn worker_with(&self, concurrency: usize, lease: Duration, grace: Duration) -> RunningWorker {
        self.start_worker(self.config(concurrency, lease, grace))
    }

    /// The scenario settings for a worker: the given lease and grace, no backoff.
    pub(crate) fn config(&self, concurrency: usize, lease: Duration, grace: Duration) -> WorkerConfig {
        WorkerConfig {
            concurrency,
            batch: concurrency,
            claimers: 2,
            lease,
            heartbeat: Some(lease / 3),
            poll: Duration::from_millis(200),
            backoff: Backoff::NONE,
            shutdown_grace: grace,
            ..WorkerConfig::default()
        }
    }

    /// Starts a worker running the probe handler on the subject's queue and ledger.
    pub(crate) fn start_worker(&self, config: WorkerConfig) -> RunningWorker {
        self.start_worker_on(self.s.queue.clone(), self.s.ledger.clone(), config)
    }

    /// Starts a worker running the probe handler on `queue` and `ledger` (the subject's, wrapped).
    pub(crate) fn start_worker_on<Q2: Claim + 'static, L2: Ledger + 'static>(
        &self,
        queue: Q2,
        ledger: L2,
        config: WorkerConfig,
    ) -> RunningWorker {
        let script = Arc::clone(&self.script);
        Worker::builder(queue, ledger)
            .config(config)
            .handle::<Probe>(move |job: Probe, ctx: JobContext| {
                let script = Arc::clone(&script);
                async move { script.handle(job, ctx).await }
            })
            .alert(AlertLog(Arc::clone(&self.script)))
            .build()
            .start()
    }

    /// Waits until `done` holds, up to the subject's timeout.
    pub(crate) async fn wait_for<F, Fut>(&self, what: &str, mut done: F) -> Result<(), Violation>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + self.s.caps.timeout;
        while !done().await {
            if tokio::time::Instant::now() > deadline {
                return Err(self.fail(format!("timed out waiting for {what}")));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Ok(())
    }

    pub(crate) async fn wait_for_effects(&self, n: usize) -> Result<(), Violation> {
        let script = Arc::clone(&self.script);
        self.wait_for(&format!("{n} effects"), || {
            let script = Arc::clone(&script);
            async move { script.effect_count() >= n }
        })
        .await
    }

    pub(crate) async fn wait_for_records(&self, n: usize) -> Result<(), Violation> {
        let queue = self.s.queue.clone();
        self.wait_for(&format!("{n} open failure records"), || {
            let queue = queue.clone();
            async move { queue.count_open().await.is_ok_and(|c| c >= n as u64) }
        })
        .await
    }

    /// Lets late duplicates show.
    pub(crate) async fn settle(&self) {
        tokio::time::sleep(self.s.caps.settle).await;
    }

    pub(crate) async fn open_records(&self) -> Result<Vec<FailureRecord>, Violation> {
        let mut query = FailureQuery::open();
        let mut all = Vec::new();
        loop {
            let page =
                self.s.queue.list(&query).await.map_err(|e| self.fail(format!("listing records failed: {e}")))?;
            let full = page.len() == query.page_size();
            query.after = page.last().map(|r| r.id.clone());
            all.extend(page);
            if !full {
                return Ok(all);
            }
        }
    }

    /// Sorts every key: `succeed` keys should be done once, `fail` keys a failure record.
    pub(crate) async fn report(&self, succeed: &[u32], fail: &[u32]) -> Result<Report, Violation> {
        let mut effects: HashMap<IdempotencyKey, usize> = HashMap::new();
        for e in self.script.effects.lock().unwrap().iter() {
            *effects.entry(e.key.clone()).or_default() += 1;
        }
        let mut records: HashMap<IdempotencyKey, usize> = HashMap::new();
        for r in self.open_records().await? {
            *records.entry(r.key).or_default() += 1;
        }
        let mut report = Report::default();
        let expected = succeed.iter().map(|id| (*id, true)).chain(fail.iter().map(|id| (*id, false)));
        for (id, should_succeed) in expected {
            let key = Probe::key(id);
            let (n, r) = (effects.remove(&key).unwrap_or(0), records.remove(&key).unwrap_or(0));
            match (n, r, should_succeed) {
                (0, 0, _) => report.lost.push(key),
                (n, _, _) if n > 1 => report.duplicated.push(key),
                (1, 0, true) => report.done_once.push(key),
                (0, 1, false) => report.failure_record.push(key),
                // Without enqueue dedupe, two messages with one failing key each fail and each
                // leave a record; replaying either is safe, since the ledger lets one run.
                (0, r, false) if r > 1 && !self.s.caps.enqueue_dedupe => report.failure_record.push(key),
                _ => report.unexpected.push(key),
            }
        }
        report.unexpected.extend(effects.into_keys().chain(records.into_keys()));
        report.unexpected.sort();
        report.unexpected.dedup();
        if report.is_clean() {
            Ok(report)
        } else {
            Err(Violation {
                scenario: self.name,
                message: "keys ended lost, duplicated or unexpected".into(),
                report: Some(Box::new(report)),
            })
        }
    }
}

/// Returns a violation from the scenario unless `cond` holds.
macro_rules! ensure {
    ($run:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($run.fail(format!($($msg)+)));
        }
    };
}
pub(crate) use ensure;

/// How far a [`Frozen`] backend has frozen.
#[derive(Default)]
pub(crate) struct Freeze(std::sync::atomic::AtomicU8);

impl Freeze {
    const CLAIMS: u8 = 1;
    const ALL: u8 = 2;

    /// Claims started from now on never return; everything else works.
    pub(crate) fn claims(&self) {
        self.0.fetch_max(Self::CLAIMS, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every call started from now on never returns, as when the process is killed.
    pub(crate) fn all(&self) {
        self.0.fetch_max(Self::ALL, std::sync::atomic::Ordering::SeqCst);
    }

    async fn wait_unless_below(&self, level: u8) {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) >= level {
            std::future::pending::<()>().await;
        }
    }
}

/// A backend (queue and ledger) as one worker sees it, frozen on demand: with its claims frozen
/// the worker takes no more jobs but finishes and settles those it has; frozen whole, nothing it
/// holds is settled, extended or handed back, as when its process is killed. Calls already in
/// flight finish.
#[derive(Clone)]
pub(crate) struct Frozen<T> {
    inner: T,
    freeze: Arc<Freeze>,
}

impl<T> Frozen<T> {
    pub(crate) fn new(inner: T, freeze: &Arc<Freeze>) -> Self {
        Self { inner, freeze: Arc::clone(freeze) }
    }

    async fn alive(&self) {
        self.freeze.wait_unless_below(Freeze::ALL).await;
    }
}

type R<T> = redrive_core::Result<T>;

impl<T: Enqueue> Enqueue for Frozen<T> {
    async fn enqueue(&self, job: NewJob) -> R<Enqueued> {
        self.alive().await;
        self.inner.enqueue(job).await
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> R<Vec<Enqueued>> {
        self.alive().await;
        self.inner.enqueue_batch(jobs).await
    }
}

impl<T: Claim> Claim for Frozen<T> {
    async fn claim(&self, max: usize, lease: Duration, wait: Duration) -> R<Vec<Claimed>> {
        self.freeze.wait_unless_below(Freeze::CLAIMS).await;
        self.inner.claim(max, lease, wait).await
    }
    async fn complete(&self, lease: &Lease) -> R<()> {
        self.alive().await;
        self.inner.complete(lease).await
    }
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> R<()> {
        self.alive().await;
        self.inner.retry(lease, delay, error).await
    }
    async fn extend(&self, lease: &Lease, by: Duration) -> R<()> {
        self.alive().await;
        self.inner.extend(lease, by).await
    }
    async fn release(&self, lease: &Lease) -> R<()> {
        self.alive().await;
        self.inner.release(lease).await
    }
    async fn dead_letter(&self, job: &Claimed, error: &str) -> R<FailureRecord> {
        self.alive().await;
        self.inner.dead_letter(job, error).await
    }
}

impl<T: Ledger> Ledger for Frozen<T> {
    async fn begin(&self, key: &IdempotencyKey, payload: &serde_json::Value, hold: Duration) -> R<Begin> {
        self.alive().await;
        self.inner.begin(key, payload, hold).await
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> R<()> {
        self.alive().await;
        self.inner.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> R<()> {
        self.alive().await;
        self.inner.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &serde_json::Value) -> R<()> {
        self.alive().await;
        self.inner.finish(hold, result).await
    }
}
