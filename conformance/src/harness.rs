//! The scenarios' moving parts: the probe jobs, the scripted handler, the effect log (no unique
//! constraint on purpose), the alert log, and a scenario's [`Run`] with its workers, waits and
//! key sort. The log capture is in `logs`, the wrappers that freeze a worker's view in `frozen`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::alert::BoxFuture;
use redrive_core::kit::{Capabilities, Claim, Dedupe, Ledger};
use redrive_core::{
    Alert, AlertSink, Backoff, DeadLetter, Error, FailureId, FailureQuery, FailureRecord, IdempotencyKey, Job,
    JobContext, JobError, KeyBuilder, NewJob, PauseAlert, ProviderKey, RunningWorker, Worker, WorkerBuilder,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};

use crate::frozen::{Freeze, Frozen};
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

    /// Probes count by their hundred (`tenant5` for ids 500 to 599) where a kind limits per key.
    fn limit_key(&self) -> Option<String> {
        Some(format!("tenant{}", self.id / 100))
    }

    /// Probes 700 to 799 run in order by their ten (`account70` for ids 700 to 709), for
    /// [`ordered_through_failure`](crate::ordered_through_failure).
    fn order_key(&self) -> Option<String> {
        order_group(self.id).map(|group| format!("account{group}"))
    }
}

/// The order key's group of a probe (its id / 10) for ids 700 to 799; `None` elsewhere.
pub(crate) fn order_group(id: u32) -> Option<u32> {
    (700..800).contains(&id).then_some(id / 10)
}

/// The [`Script::running`] entry of an order key's group: this plus [`order_group`].
pub(crate) const ORDER: u32 = 1_000_000;

/// The second kind, for [`mixed_kinds`](crate::mixed_kinds): same shape, another kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherProbe {
    /// The business fact the key derives from.
    pub id: u32,
    /// Anything.
    pub body: String,
}

/// The job kind of [`OtherProbe`].
pub const OTHER_KIND: &str = "redrive_conformance_other";

impl Job for OtherProbe {
    const KIND: &'static str = OTHER_KIND;
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("id", self.id)
    }
}

impl OtherProbe {
    pub(crate) fn key(id: u32) -> IdempotencyKey {
        IdempotencyKey::builder(OTHER_KIND).fact("id", id).build().expect("a valid probe key")
    }

    pub(crate) fn new_job(id: u32) -> NewJob {
        NewJob::from_job(&Self { id, body: format!("other {id}") }).expect("a probe always makes a job")
    }
}

/// Which probe kinds a worker handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handles {
    Both,
    Probes,
    Others,
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
    /// Kills its worker (see [`Script::kill_switch`]) every time it starts.
    Kill,
    /// Fails (retryably) the first time any delivery of the key starts; succeeds after.
    FailFirstStart,
    /// On the first attempt, calls the provider (recorded with the provider key), then kills its
    /// worker; later attempts call and succeed.
    CallThenKillFirst,
    /// Says "not now" (for the duration) at the first `n` starts of the key, then succeeds.
    NotNowFirst(u32, Duration),
    /// Says "not now" (for the duration) at the first `n` starts of the key, then fails
    /// permanently.
    NotNowThenFail(u32, Duration),
    /// Takes this long before its effect.
    Takes(Duration),
    /// Fails (retryably, as a provider's 503) while the script's outage lasts; succeeds after.
    Outage,
    /// Fails permanently while its body says "malformed" (the data is the cause).
    Malformed,
}

#[derive(Default)]
pub(crate) struct Script {
    faults: Mutex<HashMap<u32, Fault>>,
    delay: Mutex<Duration>,
    /// Every handler start: (key, attempt). Includes failed attempts.
    pub(crate) starts: Mutex<Vec<(IdempotencyKey, u32)>>,
    /// Every handler start's trace context (`JobContext::traceparent`), by key.
    traceparents: Mutex<Vec<(IdempotencyKey, Option<String>)>>,
    /// Every effect performed. No unique constraint.
    pub(crate) effects: Mutex<Vec<Effect>>,
    pub(crate) alerts: Mutex<Vec<Alert>>,
    /// Provider calls: (key, provider key), including those of attempts that died after them.
    pub(crate) calls: Mutex<Vec<(IdempotencyKey, ProviderKey)>>,
    /// The current worker's freeze: [`Fault::Kill`] freezes it whole, as if its process died.
    kill_switch: Mutex<Option<Arc<Freeze>>>,
    /// Deliveries each record's alert fails before the sink accepts it.
    alert_failures: AtomicU32,
    failed_alerts: Mutex<HashMap<FailureId, u32>>,
    /// Every handler start's time, in order.
    pub(crate) start_times: Mutex<Vec<tokio::time::Instant>>,
    /// Handlers running now and the most at once, by tenant (id / 100), by order key
    /// ([`ORDER`] + [`order_group`]) and in all ([`ALL`]).
    pub(crate) running: Mutex<HashMap<u32, (usize, usize)>>,
    /// Whether [`Fault::Outage`]'s provider is down.
    pub(crate) outage: std::sync::atomic::AtomicBool,
    /// The breakers' alerts.
    pub(crate) pause_alerts: Mutex<Vec<PauseAlert>>,
}

/// The [`Script::running`] entry of all tenants together.
pub(crate) const ALL: u32 = u32::MAX;

/// The [`Script::running`] entries a probe counts in.
fn groups(id: u32) -> impl Iterator<Item = u32> {
    [id / 100, ALL].into_iter().chain(order_group(id).map(|group| ORDER + group))
}

/// Counts a handler running, for [`Script::running`], until dropped.
struct Running<'a>(&'a Script, u32);

impl<'a> Running<'a> {
    fn start(script: &'a Script, id: u32) -> Self {
        let mut running = script.running.lock().unwrap();
        for tenant in groups(id) {
            let (now, most) = running.entry(tenant).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
        Self(script, id)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self.0.running.lock().unwrap_or_else(|p| p.into_inner());
        for tenant in groups(self.1) {
            running.entry(tenant).or_default().0 -= 1;
        }
    }
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

    /// The trace context each start of `key` was given.
    pub(crate) fn traceparents_of(&self, key: &IdempotencyKey) -> Vec<Option<String>> {
        self.traceparents.lock().unwrap().iter().filter(|(k, _)| k == key).map(|(_, t)| t.clone()).collect()
    }

    pub(crate) fn alert_count(&self) -> usize {
        self.alerts.lock().unwrap().len()
    }

    /// The handlers running now of one tenant (id / 100).
    pub(crate) fn running_now(&self, tenant: u32) -> usize {
        self.running.lock().unwrap().get(&tenant).map_or(0, |(now, _)| *now)
    }

    /// The most handlers that ran at once: of one tenant (id / 100), of an order key ([`ORDER`]
    /// + its group), or of all ([`ALL`]).
    pub(crate) fn most_running(&self, tenant: u32) -> usize {
        self.running.lock().unwrap().get(&tenant).map_or(0, |(_, most)| *most)
    }

    /// The freeze that [`Fault::Kill`] pulls: the worker started with it dies.
    pub(crate) fn kill_switch(&self, freeze: &Arc<Freeze>) {
        *self.kill_switch.lock().unwrap() = Some(Arc::clone(freeze));
    }

    /// The alert sink fails each record's first `n` deliveries.
    pub(crate) fn flaky_alerts(&self, n: u32) {
        self.alert_failures.store(n, Ordering::SeqCst);
    }

    async fn kill(&self) -> ! {
        if let Some(freeze) = self.kill_switch.lock().unwrap().as_ref() {
            freeze.all();
        }
        std::future::pending().await
    }

    async fn handle(&self, job: Probe, ctx: JobContext) -> Result<u32, JobError> {
        self.starts.lock().unwrap().push((ctx.key.clone(), ctx.attempt));
        self.traceparents.lock().unwrap().push((ctx.key.clone(), ctx.traceparent.clone()));
        self.start_times.lock().unwrap().push(tokio::time::Instant::now());
        let _running = Running::start(self, job.id);
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
            Some(Fault::Kill) => self.kill().await,
            Some(Fault::FailFirstStart) if self.starts_of(&ctx.key).len() == 1 => {
                return Err(JobError::retry("forced failure of the first start"));
            }
            Some(Fault::NotNowFirst(n, delay) | Fault::NotNowThenFail(n, delay))
                if self.starts_of(&ctx.key).len() <= n as usize =>
            {
                return Err(JobError::not_now(delay, format!("not now: probe {} is rate limited", job.id)));
            }
            Some(Fault::NotNowThenFail(..)) => {
                return Err(JobError::permanent(format!("forced permanent failure of probe {}", job.id)));
            }
            Some(Fault::Takes(time)) => tokio::time::sleep(time).await,
            Some(Fault::Malformed) if job.body.contains("malformed") => {
                return Err(JobError::permanent(format!("probe {}: the address does not parse", job.id)));
            }
            Some(Fault::Outage) if self.outage.load(Ordering::SeqCst) => {
                return Err(JobError::retry("the provider answered 503 Service Unavailable"));
            }
            Some(Fault::CallThenKillFirst) => {
                self.calls.lock().unwrap().push((ctx.key.clone(), ctx.provider_key));
                if ctx.attempt == 1 && !ctx.earlier_attempt_pending {
                    self.kill().await;
                }
            }
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
        let script = &self.0;
        let fail_first = script.alert_failures.load(Ordering::SeqCst);
        let mut failed = script.failed_alerts.lock().unwrap();
        let failures = failed.entry(alert.record.id.clone()).or_default();
        if *failures < fail_first {
            *failures += 1;
            return Box::pin(async { Err(Error::temporary("the pager answered 429 Too Many Requests")) });
        }
        drop(failed);
        script.alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }

    fn paused<'a>(&'a self, alert: &'a PauseAlert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.pause_alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

/// One scenario's run: the subject, the script and the checks.
pub(crate) struct Run<Q, L> {
    pub(crate) name: &'static str,
    pub(crate) s: Subject<Q, L>,
    /// What the queue declares it can do.
    pub(crate) caps: Capabilities,
    pub(crate) script: Arc<Script>,
}

impl<Q: Queue, L: Ledger + Clone + 'static> Run<Q, L> {
    pub(crate) fn new(name: &'static str, s: Subject<Q, L>) -> Self {
        Self { name, caps: s.queue.capabilities(), s, script: Arc::default() }
    }

    /// Whether a key enqueued twice is delivered once (the second copy answered `Duplicate`, or
    /// dropped unreported by the service).
    pub(crate) fn dedupe(&self) -> bool {
        self.caps.dedupe != Dedupe::None
    }

    /// After `key`'s job was enqueued again within a service's `window` in which it drops a copy
    /// of the same payload unreported (Inngest): nothing runs, nothing is recorded. `what` names
    /// the key's story ("a purged key"). A replay sends under an id of its own for this reason.
    pub(crate) async fn dropped_unreported(
        &self,
        key: &IdempotencyKey,
        window: Duration,
        what: &str,
    ) -> crate::Outcome {
        self.settle().await;
        if !self.script.effects_of(key).is_empty() {
            return Err(
                self.fail(format!("within the service's {window:?} window {what}'s copy should be dropped, not run"))
            );
        }
        if self.must("count", self.s.queue.count_open().await)? != 0 {
            return Err(self.fail("nothing should be recorded"));
        }
        Ok(Report::default())
    }

    /// Whether enqueuing a key twice answers `Duplicate`.
    pub(crate) fn reports_duplicates(&self) -> bool {
        matches!(self.caps.dedupe, Dedupe::Kept | Dedupe::Window(_))
    }

    /// The shortest lease worth asking for in the expiry scenarios.
    pub(crate) fn short_lease(&self) -> Duration {
        self.caps.min_lease.max(Duration::from_millis(300))
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
        self.worker_with(concurrency, self.s.timing.lease, Duration::from_secs(30))
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
            alert_sweep: lease,
            ..WorkerConfig::default()
        }
    }

    /// Starts a worker running the probe handler on the subject's queue and ledger.
    pub(crate) fn start_worker(&self, config: WorkerConfig) -> RunningWorker {
        self.start_worker_on(self.s.queue.clone(), self.s.ledger.clone(), config)
    }

    /// Starts a worker running the probe handler on `queue` and `ledger` (the subject's, wrapped).
    pub(crate) fn start_worker_on<Q2: Claim + DeadLetter + 'static, L2: Ledger + 'static>(
        &self,
        queue: Q2,
        ledger: L2,
        config: WorkerConfig,
    ) -> RunningWorker {
        self.start_worker_for(queue, ledger, config, Handles::Both)
    }

    /// Starts a worker with handlers for `handles` only.
    pub(crate) fn start_worker_for<Q2: Claim + DeadLetter + 'static, L2: Ledger + 'static>(
        &self,
        queue: Q2,
        ledger: L2,
        config: WorkerConfig,
        handles: Handles,
    ) -> RunningWorker {
        self.builder_for(queue, ledger, config, handles).build().start()
    }

    /// A worker's builder with handlers for `handles` only, for a scenario to add to.
    pub(crate) fn builder_for<Q2: Claim + DeadLetter + 'static, L2: Ledger + 'static>(
        &self,
        queue: Q2,
        ledger: L2,
        config: WorkerConfig,
        handles: Handles,
    ) -> WorkerBuilder<Q2, L2> {
        let mut builder = Worker::builder(queue, ledger).config(config).alert(AlertLog(Arc::clone(&self.script)));
        if handles != Handles::Others {
            let script = Arc::clone(&self.script);
            builder = builder.handle::<Probe>(move |job: Probe, ctx: JobContext| {
                let script = Arc::clone(&script);
                async move { script.handle(job, ctx).await }
            });
        }
        if handles != Handles::Probes {
            let script = Arc::clone(&self.script);
            builder = builder.handle::<OtherProbe>(move |job: OtherProbe, ctx: JobContext| {
                let script = Arc::clone(&script);
                async move { script.handle(Probe { id: job.id, body: job.body }, ctx).await }
            });
        }
        builder
    }

    /// A worker whose view of the subject can be frozen (stalled, broken or killed) through
    /// `freeze`, with the scenario settings.
    pub(crate) fn frozen_worker(&self, freeze: &Arc<Freeze>, config: WorkerConfig) -> RunningWorker {
        self.start_worker_on(
            Frozen::new(self.s.queue.clone(), freeze),
            Frozen::new(self.s.ledger.clone(), freeze),
            config,
        )
    }

    /// Waits until `done` holds, up to the subject's timeout.
    pub(crate) async fn wait_for<F, Fut>(&self, what: &str, mut done: F) -> Result<(), Violation>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + self.s.timing.timeout;
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
        tokio::time::sleep(self.s.timing.settle).await;
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

    /// Sorts every key: probe `succeed` ids should be done once, `fail` ids a failure record.
    pub(crate) async fn report(&self, succeed: &[u32], fail: &[u32]) -> Result<Report, Violation> {
        let keys = |ids: &[u32]| ids.iter().map(|id| Probe::key(*id)).collect::<Vec<_>>();
        self.report_keys(&keys(succeed), &keys(fail)).await
    }

    /// Sorts every key: `succeed` keys should be done once, `fail` keys a failure record.
    pub(crate) async fn report_keys(
        &self,
        succeed: &[IdempotencyKey],
        fail: &[IdempotencyKey],
    ) -> Result<Report, Violation> {
        let mut effects: HashMap<IdempotencyKey, usize> = HashMap::new();
        for e in self.script.effects.lock().unwrap().iter() {
            *effects.entry(e.key.clone()).or_default() += 1;
        }
        let mut records: HashMap<IdempotencyKey, usize> = HashMap::new();
        for r in self.open_records().await? {
            *records.entry(r.key).or_default() += 1;
        }
        let mut report = Report::default();
        let expected = succeed.iter().map(|k| (k, true)).chain(fail.iter().map(|k| (k, false)));
        for (key, should_succeed) in expected {
            let key = key.clone();
            let (n, r) = (effects.remove(&key).unwrap_or(0), records.remove(&key).unwrap_or(0));
            match (n, r, should_succeed) {
                (0, 0, _) => report.lost.push(key),
                (n, _, _) if n > 1 => report.duplicated.push(key),
                (1, 0, true) => report.done_once.push(key),
                (0, 1, false) => report.failure_record.push(key),
                // Without enqueue dedupe, two messages with one failing key each fail and each
                // leave a record; replaying either is safe, since the ledger lets one run.
                (0, r, false) if r > 1 && !self.dedupe() => report.failure_record.push(key),
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
