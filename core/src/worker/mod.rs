//! The worker: one for every backend. Claim → admit → handler → settle, and an alert for every
//! failure record. What to do is decided by pure functions, apart from the mechanics that carry
//! it out: admission (whether a claimed job runs now) and the retry policy
//! ([`RetryPolicy`](crate::RetryPolicy), what follows a run).
//!
//! - `mod.rs`: configuration, the builder, start and shutdown, and what the parts share;
//! - `claiming.rs` (`Claiming`): the claimers, the pace of claims and the dispatcher;
//! - `admission.rs`: whether a claimed job runs now (run, defer, complete unrun, dead-letter,
//!   release), table-tested;
//! - `attempt.rs` (`Attempts`): one job's attempt, carrying admission and the retry decision out;
//! - `hold.rs`: the key's hold, kept alive one path per `HoldMode` (the job's lease, or a hold
//!   in the ledger);
//! - `settle.rs`: settlements, tried again while they fail for a temporary reason;
//! - `alerts.rs` (`Alerting`): alerts delivered at least once per record, deduplicated through
//!   the ledger;
//! - `flow.rs` (`Flowing`): flow control's mechanics: the kinds' pauses and limits as the store
//!   last said, the gate a job passes before its hold (slots, tokens, a breaker's probe), and
//!   the circuit breakers;
//! - `handler.rs`, `stats.rs`: the handler API and the counters.

mod admission;
pub(crate) mod alerts;
mod attempt;
mod claiming;
mod flow;
mod handler;
mod hold;
mod permits;
mod settle;
mod stats;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, info_span};

use self::alerts::Alerting;
use self::attempt::Attempts;
use self::claiming::Claiming;
pub use self::flow::Breaker;
use self::flow::Flowing;
use self::handler::{Erased, Typed};
pub use self::handler::{Handler, HandlerResult};
pub use self::stats::WorkerStats;
use self::stats::{Count, Counters};
use crate::alert::{Alert, AlertSink, TracingAlerts};
use crate::backend::{Capabilities, Claim, Claimed, DeadLetter, Kinds, Ledger};
use crate::job::Job;
use crate::policy::Backoff;

/// How a worker runs. Every field has a sensible default.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Handlers running at once (default 8).
    pub concurrency: usize,
    /// Most jobs per claim call (default 128; a backend may take fewer, SQS at most 10). A claim
    /// asks for about a second of work at the handlers' recent pace, up to this: quick jobs come
    /// in full batches, slow ones a few at a time, so workers sharing a queue share its work.
    /// Claimed jobs wait in a buffer ahead of the handlers (at most `batch × claimers`); one that
    /// waits half its claim lease is handed back rather than run late.
    pub batch: usize,
    /// Claim calls in flight at once (default 4), so claims' round trips overlap.
    pub claimers: usize,
    /// How long a running handler's job is held before another worker may take it (default
    /// 30 s); the heartbeat renews it.
    pub lease: Duration,
    /// The shorter lease a job is claimed with, until its handler starts (default 3 s; at most
    /// `lease`). A worker that dies strands the jobs it claimed ahead for this long, not for a
    /// whole `lease`. A handler still running after its first poll has its job's lease extended
    /// to `lease` at once, heartbeat or not; a handler done at its first poll settles within the
    /// claim lease and costs no extension.
    pub claim_lease: Duration,
    /// How often a running handler's lease is extended; `None` turns the heartbeat off
    /// (default: a third of the lease). The ledger hold is extended at this pace (or a third of
    /// the lease) either way, for as long as the handler runs. Where the job's lease is its key's
    /// hold (Postgres jobs), that keeps the lease too: a hung handler then holds its job for as
    /// long as its process lives, heartbeat or not. If no renewal of the hold gets through before
    /// it would lapse, the handler is cancelled first (counted in [`WorkerStats::cancelled`]) and
    /// the job retried, so that two attempts of one key never run at once.
    pub heartbeat: Option<Duration>,
    /// How long one claim call waits for work (default 1 s; also bounds shutdown latency).
    pub poll: Duration,
    /// Delays between attempts.
    pub backoff: Backoff,
    /// On shutdown, how long running handlers get to finish before their jobs are released
    /// (default 30 s). A released job is not charged an attempt: it did not fail, its worker
    /// stopped, and a job longer than the grace must not end as a record after a few deploys. It
    /// runs again from the start (its key resumed) on another worker.
    pub shutdown_grace: Duration,
    /// How often the worker looks for failure records whose alert was not delivered (a sink
    /// that kept failing, a worker that died between the record and its alert), and delivers
    /// it (default 60 s; also once at start).
    pub alert_sweep: Duration,
    /// While a record stays open, its alert is sent again (a reminder, [`Alert::reminder`]
    /// counting them) once per this period of its age, found by the sweep, 16 times at most: a
    /// record nobody reads loses work as surely as a delete does (default `None`: no reminders).
    pub remind_after: Option<Duration>,
    /// How long a job may be put back "not now" ([`JobError::not_now`](crate::JobError::not_now))
    /// at no attempt's cost (default 24 h, [`DEFAULT_MAX_NOT_NOW`](crate::DEFAULT_MAX_NOT_NOW)).
    /// Counted from when the job was first enqueued ([`JobRecord::enqueued_at`](crate::JobRecord)),
    /// so no backend stores anything more for it; past it, a "not now" is an ordinary retry after
    /// the delay asked for, spending an attempt, so a job cannot wait for ever unseen.
    pub max_not_now: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let lease = Duration::from_secs(30);
        Self {
            concurrency: 8,
            batch: 128,
            claimers: 4,
            lease,
            claim_lease: Duration::from_secs(3),
            heartbeat: Some(lease / 3),
            poll: Duration::from_secs(1),
            backoff: Backoff::default(),
            shutdown_grace: Duration::from_secs(30),
            alert_sweep: Duration::from_secs(60),
            remind_after: None,
            max_not_now: crate::policy::DEFAULT_MAX_NOT_NOW,
        }
    }
}

/// Builds a [`Worker`]: the queue to claim from, the ledger, the handlers, the alert sinks.
///
/// The setters ([`concurrency`](Self::concurrency), [`lease`](Self::lease), [`poll`](Self::poll)
/// …) compose in any order, and with [`config`](Self::config): a whole [`WorkerConfig`] is the
/// base, and each setter called, before or after it, overrides its one field.
///
/// ```
/// use std::time::Duration;
/// use redrive_core::{MemoryBackend, Worker, WorkerConfig};
///
/// let backend = MemoryBackend::new();
/// let worker = Worker::builder(backend.clone(), backend)
///     .concurrency(2)
///     .config(WorkerConfig { concurrency: 16, batch: 32, ..WorkerConfig::default() })
///     .lease(Duration::from_secs(60))
///     .build();
/// // The setter wins over the base, whichever came first; the base's other fields stay.
/// assert_eq!((worker.config().concurrency, worker.config().batch), (2, 32));
/// assert_eq!(worker.config().heartbeat, Some(Duration::from_secs(20)), "a third of the lease");
/// ```
pub struct WorkerBuilder<Q, L> {
    queue: Q,
    ledger: L,
    config: WorkerConfig,
    set: Overrides,
    handlers: HashMap<String, Arc<dyn Erased>>,
    /// Limits on one attempt set for this worker, by kind, over the job types' own.
    timeouts: HashMap<String, Duration>,
    /// Circuit breakers, by kind.
    breakers: HashMap<String, Breaker>,
    alerts: Vec<Arc<dyn AlertSink>>,
}

/// The fields a builder's setters chose, applied over the base configuration at `build`, so
/// that `config(..)` and the setters compose in any order.
#[derive(Debug, Default)]
struct Overrides {
    concurrency: Option<usize>,
    batch: Option<usize>,
    claimers: Option<usize>,
    lease: Option<Duration>,
    heartbeat: Option<Option<Duration>>,
    poll: Option<Duration>,
    backoff: Option<Backoff>,
    shutdown_grace: Option<Duration>,
    alert_sweep: Option<Duration>,
}

impl Overrides {
    fn apply(self, mut config: WorkerConfig) -> WorkerConfig {
        config.concurrency = self.concurrency.unwrap_or(config.concurrency);
        config.batch = self.batch.unwrap_or(config.batch);
        config.claimers = self.claimers.unwrap_or(config.claimers);
        if let Some(lease) = self.lease {
            config.lease = lease;
            // The heartbeat follows a new lease, unless it was set or turned off.
            config.heartbeat = config.heartbeat.map(|_| lease / 3);
        }
        config.heartbeat = self.heartbeat.unwrap_or(config.heartbeat);
        config.poll = self.poll.unwrap_or(config.poll);
        config.backoff = self.backoff.unwrap_or(config.backoff);
        config.shutdown_grace = self.shutdown_grace.unwrap_or(config.shutdown_grace);
        config.alert_sweep = self.alert_sweep.unwrap_or(config.alert_sweep);
        config
    }
}

impl<Q: Claim + DeadLetter + 'static, L: Ledger + 'static> WorkerBuilder<Q, L> {
    /// Registers the handler for job type `J`.
    pub fn handle<J: Job>(mut self, handler: impl Handler<J>) -> Self {
        self.handlers.insert(J::KIND.to_owned(), Arc::new(Typed(handler, std::marker::PhantomData)));
        self
    }

    /// Limits one attempt of job type `J` to `limit` on this worker, over [`Job::TIMEOUT`]
    /// (before or after [`handle`](Self::handle)): at the limit the handler's future is dropped,
    /// and the attempt counts as a retryable failure, "timed out after …", with the key's hold
    /// released and the usual retries, cap and failure record after it.
    pub fn timeout<J: Job>(mut self, limit: Duration) -> Self {
        self.timeouts.insert(J::KIND.to_owned(), limit);
        self
    }

    /// Puts a circuit breaker on job type `J` (see [`Breaker`]): after `breaker.after` retryable
    /// failures in a row the kind pauses itself for every worker, alerts once, and lets a probe
    /// job through every `breaker.cool_down` until one succeeds. Its jobs wait meanwhile at no
    /// attempt's cost, so a provider's outage ends as a wait, not as failure records.
    pub fn breaker<J: Job>(mut self, breaker: Breaker) -> Self {
        self.breakers.insert(J::KIND.to_owned(), breaker);
        self
    }

    /// Sets the base configuration: every field a setter of this builder does not set, whether
    /// that setter is called before or after this. Called twice, the later base wins.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Handlers running at once (at least 1). See [`WorkerConfig::concurrency`].
    pub fn concurrency(mut self, n: usize) -> Self {
        self.set.concurrency = Some(n.max(1));
        self
    }

    /// Most jobs per claim call (at least 1). See [`WorkerConfig::batch`].
    pub fn batch(mut self, n: usize) -> Self {
        self.set.batch = Some(n.max(1));
        self
    }

    /// Claim calls in flight at once (at least 1). See [`WorkerConfig::claimers`].
    pub fn claimers(mut self, n: usize) -> Self {
        self.set.claimers = Some(n.max(1));
        self
    }

    /// The lease per claim. The heartbeat follows at a third of it, unless
    /// [`heartbeat`](Self::heartbeat) is called (before or after this) or the base
    /// configuration turned it off.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.set.lease = Some(lease);
        self
    }

    /// How often a running handler's lease is extended; `None` turns the heartbeat off. See
    /// [`WorkerConfig::heartbeat`].
    pub fn heartbeat(mut self, every: Option<Duration>) -> Self {
        self.set.heartbeat = Some(every);
        self
    }

    /// How long one claim call waits for work. See [`WorkerConfig::poll`].
    pub fn poll(mut self, wait: Duration) -> Self {
        self.set.poll = Some(wait);
        self
    }

    /// The delays between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.set.backoff = Some(backoff);
        self
    }

    /// On shutdown, how long running handlers get to finish. See
    /// [`WorkerConfig::shutdown_grace`].
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.set.shutdown_grace = Some(grace);
        self
    }

    /// How often to look for records whose alert was not delivered. See
    /// [`WorkerConfig::alert_sweep`].
    pub fn alert_sweep(mut self, every: Duration) -> Self {
        self.set.alert_sweep = Some(every);
        self
    }

    /// Adds an alert sink. Without any, alerts go to [`TracingAlerts`]. Each sink gets each
    /// record's alert once: a failed delivery is retried with backoff, then by the next sweep.
    pub fn alert(mut self, sink: impl AlertSink) -> Self {
        self.alerts.push(Arc::new(sink));
        self
    }

    /// Adds an alert sink made from a closure; see [`alert::from_fn`](crate::alert::from_fn).
    pub fn alert_fn<F, Fut>(self, send: F) -> Self
    where
        F: Fn(Alert) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = crate::Result<()>> + Send + 'static,
    {
        self.alert(crate::alert::from_fn(send))
    }

    /// The worker, ready to [`start`](Worker::start).
    pub fn build(mut self) -> Worker<Q, L> {
        if self.alerts.is_empty() {
            self.alerts.push(Arc::new(TracingAlerts));
        }
        let config = self.set.apply(self.config);
        let caps = self.queue.capabilities();
        // Without renewal a claimed job cannot move to a longer lease: claim it on the full one.
        let claim_lease =
            if self.queue.renewal().is_some() { config.claim_lease.min(config.lease) } else { config.lease };
        let mut kinds: Vec<String> = self.handlers.keys().cloned().collect();
        kinds.sort();
        Worker {
            shared: Arc::new(Shared {
                messaging: Messaging {
                    system: self.queue.messaging_system(),
                    destination: self.queue.messaging_destination(),
                },
                claiming: Claiming::new(Kinds::Only(kinds), config.concurrency),
                attempts: Attempts::new(self.handlers, self.timeouts, &config, claim_lease),
                alerting: Alerting::new(self.alerts),
                flowing: Flowing::new(self.breakers, config.poll, config.lease),
                queue: self.queue,
                ledger: self.ledger,
                claim_lease,
                caps,
                config,
                counters: Counters::default(),
            }),
        }
    }
}

/// Runs handlers for claimed jobs, so that each key's effect happens once and each job that
/// cannot succeed ends as a failure record with one alert.
pub struct Worker<Q, L> {
    shared: Arc<Shared<Q, L>>,
}

/// What the worker's tasks share: the queue, the ledger, the configuration and the counters, and
/// the parts that own claiming, attempts and alerts (each with its own state, in its own file).
struct Shared<Q, L> {
    queue: Q,
    ledger: L,
    config: WorkerConfig,
    /// The lease jobs are claimed with: `config.claim_lease`, or the full lease where the queue
    /// cannot renew.
    claim_lease: Duration,
    caps: Capabilities,
    /// How the queue is named in jobs' spans.
    messaging: Messaging,
    counters: Counters,
    claiming: Claiming,
    attempts: Attempts,
    alerting: Alerting,
    flowing: Flowing,
}

impl<Q: Claim + DeadLetter + 'static, L: Ledger + 'static> Worker<Q, L> {
    /// Starts building a worker over `queue` and `ledger` (often the same backend value).
    pub fn builder(queue: Q, ledger: L) -> WorkerBuilder<Q, L> {
        WorkerBuilder {
            queue,
            ledger,
            config: WorkerConfig::default(),
            set: Overrides::default(),
            handlers: HashMap::new(),
            timeouts: HashMap::new(),
            breakers: HashMap::new(),
            alerts: Vec::new(),
        }
    }

    /// The configuration the worker runs with.
    pub fn config(&self) -> &WorkerConfig {
        &self.shared.config
    }

    /// Spawns the worker on the current Tokio runtime.
    pub fn start(self) -> RunningWorker {
        let stop = CancellationToken::new();
        let abandon = self.shared.attempts.abandon().clone();
        let tracker = TaskTracker::new();
        let shared = Arc::clone(&self.shared);
        let counters: Arc<dyn Fn() -> WorkerStats + Send + Sync> = Arc::new(move || shared.counters.snapshot());
        let grace = self.shared.config.shutdown_grace;
        let main = tokio::spawn(claiming::claim_loop(self.shared, stop.clone(), tracker.clone()));
        RunningWorker { stop, abandon, tracker, main: Some(main), grace, stats: counters }
    }

    /// Runs until `signal` resolves, then shuts down gracefully. Returns the final counters.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> WorkerStats {
        let running = self.start();
        signal.await;
        running.shutdown().await
    }
}

/// A started worker. Shut it down with [`shutdown`](Self::shutdown) (or
/// [`run_until_signal`](Self::run_until_signal)) to wait for it; dropped without that, it shuts
/// down the same way in the background: it stops claiming, its running handlers get the grace to
/// finish, and the jobs of those still running are then released. A worker is never left running
/// with nothing that can stop it.
#[must_use = "a RunningWorker dropped at once shuts its worker down"]
pub struct RunningWorker {
    stop: CancellationToken,
    abandon: CancellationToken,
    tracker: TaskTracker,
    /// The claim loop; taken by the shutdown, so that a drop after it does nothing.
    main: Option<tokio::task::JoinHandle<()>>,
    grace: Duration,
    stats: Arc<dyn Fn() -> WorkerStats + Send + Sync>,
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        let Some(main) = self.main.take() else { return };
        self.stop.cancel();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                info!("worker dropped without a shutdown: shutting it down in the background");
                runtime.spawn(wind_down(main, self.tracker.clone(), self.abandon.clone(), self.grace));
            }
            // No runtime left to run the grace in: its tasks are gone with it.
            Err(_) => self.abandon.cancel(),
        }
    }
}

/// Waits for the claim loop to stop, gives running handlers `grace` to finish, then releases the
/// jobs of those still running and waits for their settlement.
async fn wind_down(
    main: tokio::task::JoinHandle<()>,
    tracker: TaskTracker,
    abandon: CancellationToken,
    grace: Duration,
) {
    if let Err(e) = main.await {
        error!(error = %e, "worker claim loop panicked");
    }
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        info!("shutdown grace over: releasing the jobs still running");
        abandon.cancel();
        tracker.wait().await;
    }
}

impl RunningWorker {
    /// What the worker has done so far.
    pub fn stats(&self) -> WorkerStats {
        (self.stats)()
    }

    /// Stops claiming, lets running handlers finish within the configured grace, then releases
    /// the jobs of those still running (at no attempt's cost) so another worker takes them at
    /// once. Settlements still being tried again (a busy database) stop at the grace's end too.
    pub async fn shutdown(self) -> WorkerStats {
        let grace = self.grace;
        self.shutdown_within(grace).await
    }

    /// Runs until the process is asked to stop (SIGTERM, as from a service manager or
    /// Kubernetes, or SIGINT, Ctrl-C), then shuts down as [`shutdown`](Self::shutdown) does:
    /// running handlers finish within the grace, the rest are released. The one call a
    /// service's `main` needs after starting its workers.
    pub async fn run_until_signal(self) -> WorkerStats {
        stop_signal().await;
        info!("stop signal received: the worker finishes its running jobs and stops");
        self.shutdown().await
    }

    /// [`shutdown`](Self::shutdown) with an explicit grace (`Duration::ZERO`: release at once).
    pub async fn shutdown_within(mut self, grace: Duration) -> WorkerStats {
        self.stop.cancel();
        if let Some(main) = self.main.take() {
            wind_down(main, self.tracker.clone(), self.abandon.clone(), grace).await;
        }
        (self.stats)()
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C elsewhere than Unix): what
/// [`RunningWorker::run_until_signal`] waits for, for servers beside a worker (the dashboard) to
/// stop on the same signals. A signal that cannot be listened for is logged, and the other one
/// is waited for.
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM; waiting for SIGINT only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How the queue is named in a job's span (OpenTelemetry's messaging attributes), read from the
/// backend once.
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
struct Messaging {
    system: Option<&'static str>,
    destination: Option<String>,
}

/// Every log event about a job carries its id, kind, attempt and key; never its payload. The span
/// is a root: a job's work is its own, whatever span the worker was started in.
///
/// With the `otel` feature it is the consumer span of OpenTelemetry's messaging conventions
/// (`process {kind}`, the system, the queue and the message id), the child of the producer's
/// context on the job's first attempt, linked to it on a retry or a replay.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
fn job_span(claimed: &Claimed, messaging: &Messaging) -> tracing::Span {
    let job = &claimed.job;
    #[cfg(not(feature = "otel"))]
    let span = info_span!(parent: None, "job", id = %job.id, kind = %job.kind, attempt = job.attempt, key = %job.key);
    #[cfg(feature = "otel")]
    let span = {
        let span = info_span!(
            parent: None,
            "job",
            id = %job.id,
            kind = %job.kind,
            attempt = job.attempt,
            key = %job.key,
            otel.name = %format_args!("process {}", job.kind),
            otel.kind = "consumer",
            messaging.operation.type = "process",
            messaging.system = messaging.system,
            messaging.destination.name = messaging.destination.as_deref(),
            messaging.message.id = %job.id,
        );
        crate::trace::otel::follow(&span, job);
        span
    };
    span
}

#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod tests;
