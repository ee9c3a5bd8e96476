//! The worker: one for every backend. Claim → decode → ledger check → handler → settle.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures_util::FutureExt;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::alert::{Alert, AlertSink, BoxFuture, TracingAlerts};
use crate::backend::{Begin, Claim, Claimed, Hold, Ledger};
use crate::error::ErrorKind;
use crate::job::{Job, JobContext, JobError};
use crate::policy::{Backoff, Decision, Outcome, RetryPolicy};

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
    /// long as its process lives, heartbeat or not.
    pub heartbeat: Option<Duration>,
    /// How long one claim call waits for work (default 1 s; also bounds shutdown latency).
    pub poll: Duration,
    /// Delays between attempts.
    pub backoff: Backoff,
    /// On shutdown, how long running handlers get to finish before their jobs are released
    /// (default 30 s).
    pub shutdown_grace: Duration,
}

impl WorkerConfig {
    /// The lease jobs are claimed with: `claim_lease`, never longer than `lease`.
    fn claim_lease(&self) -> Duration {
        self.claim_lease.min(self.lease)
    }
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
        }
    }
}

/// Counters of what a worker did, for tests, metrics and the quickstart's evidence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs claimed.
    pub claimed: u64,
    /// Handlers that succeeded (effect done, job complete).
    pub succeeded: u64,
    /// Jobs acknowledged without running because the ledger said the effect was done.
    pub skipped: u64,
    /// Jobs put back because another attempt held the key.
    pub deferred: u64,
    /// Failed attempts put back for a retry.
    pub retried: u64,
    /// Failure records written.
    pub dead_lettered: u64,
    /// Running jobs given back when the shutdown grace ran out.
    pub released: u64,
    /// Claimed jobs given back before they started: at shutdown, or after waiting half their
    /// lease in the buffer.
    pub handed_back: u64,
    /// Settlements refused because the lease had moved on.
    pub lease_lost: u64,
}

/// How much work a worker claims ahead of its handlers: about this long of it. Fast jobs are
/// claimed in full batches; slow ones a few at a time, so that several workers on one queue share
/// the work instead of one holding a batch it needs minutes to get through.
const CLAIM_AHEAD: Duration = Duration::from_secs(1);

/// A moving average of how long handlers take, in microseconds; 0 until one has finished.
#[derive(Debug, Default)]
struct Pace(AtomicU64);

impl Pace {
    fn record(&self, took: Duration) {
        let took = took.as_micros().clamp(1, u64::MAX as u128) as u64;
        // Weight 1/4 to the newest: it follows a change of workload within a few jobs.
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 { took } else { avg - avg / 4 + took / 4 })
        });
    }

    /// Jobs to hold claimed ahead of the handlers: as many as they get through in
    /// [`CLAIM_AHEAD`] (or a quarter of the claim lease, if shorter). None before any handler
    /// has finished: nothing says yet whether the jobs are quick, and a slow job claimed ahead
    /// would wait out its claim lease in the buffer.
    fn ahead(&self, config: &WorkerConfig) -> usize {
        let concurrency = config.concurrency.max(1) as u128;
        let avg = self.0.load(Ordering::Relaxed) as u128;
        // Never more than a quarter of the claim lease's worth, so that a claimed job starts well
        // before its claim lease is half gone (and it would be handed back).
        let work = CLAIM_AHEAD.min(config.claim_lease() / 4).as_micros();
        let ahead = (concurrency * work).checked_div(avg).unwrap_or(0);
        ahead.min(usize::MAX as u128) as usize
    }
}

#[derive(Debug, Default)]
struct Counters([AtomicU64; 9]);

#[derive(Clone, Copy)]
enum Count {
    Claimed,
    Succeeded,
    Skipped,
    Deferred,
    Retried,
    DeadLettered,
    Released,
    HandedBack,
    LeaseLost,
}

impl Counters {
    fn add(&self, which: Count, n: u64) {
        self.0[which as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> WorkerStats {
        let get = |c: Count| self.0[c as usize].load(Ordering::Relaxed);
        WorkerStats {
            claimed: get(Count::Claimed),
            succeeded: get(Count::Succeeded),
            skipped: get(Count::Skipped),
            deferred: get(Count::Deferred),
            retried: get(Count::Retried),
            dead_lettered: get(Count::DeadLettered),
            released: get(Count::Released),
            handed_back: get(Count::HandedBack),
            lease_lost: get(Count::LeaseLost),
        }
    }
}

/// A handler's result for one attempt.
pub type HandlerResult = Result<Value, JobError>;

/// A handler for jobs of type `J`: any `Fn(J, JobContext) -> impl Future<Output =
/// Result<T, JobError>>` where `T: Serialize` (stored in the ledger as the effect's result).
pub trait Handler<J>: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, HandlerResult>;
}

impl<J, F, Fut, T> Handler<J> for F
where
    J: Job,
    F: Fn(J, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, JobError>> + Send + 'static,
    T: Serialize,
{
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let fut = self(job, ctx);
        Box::pin(async move {
            let value = fut.await?;
            Ok(serde_json::to_value(value).unwrap_or(Value::Null))
        })
    }
}

/// A handler with its job type erased: decodes the payload, then runs.
trait Erased: Send + Sync {
    fn prepare(&self, payload: &Value, ctx: JobContext) -> Result<BoxFuture<'static, HandlerResult>, String>;
}

struct Typed<J, H>(H, std::marker::PhantomData<fn() -> J>);

impl<J: Job, H: Handler<J>> Erased for Typed<J, H> {
    fn prepare(&self, payload: &Value, ctx: JobContext) -> Result<BoxFuture<'static, HandlerResult>, String> {
        // The message names the field and the expected type, never the value: it is logged,
        // stored as the record's last error and alerted.
        let job = crate::decode::payload::<J>(payload)?;
        // A handler runs code before it returns its future (a closure's body up to `async`). A
        // panic there must end this attempt like one inside the future, not the worker's task:
        // otherwise nothing settles the job and it waits out its lease, its panic message lost.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.0.call(job, ctx))) {
            Ok(run) => Ok(run),
            Err(panic) => Ok(Box::pin(std::future::ready(Err(panicked(panic))))),
        }
    }
}

/// A failed attempt for a handler that panicked, keeping the panic's message (the handler
/// author's words) when it is a string, as `panic!` and `expect` make it.
fn panicked(panic: Box<dyn std::any::Any + Send>) -> JobError {
    let message = panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    match message {
        Some(message) => JobError::retry(format!("the handler panicked: {message}")),
        None => JobError::retry("the handler panicked"),
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
        config
    }
}

impl<Q: Claim + 'static, L: Ledger + 'static> WorkerBuilder<Q, L> {
    /// Registers the handler for job type `J`.
    pub fn handle<J: Job>(mut self, handler: impl Handler<J>) -> Self {
        self.handlers.insert(J::KIND.to_owned(), Arc::new(Typed(handler, std::marker::PhantomData)));
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

    /// Adds an alert sink. Without any, alerts go to [`TracingAlerts`].
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
        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        Worker {
            shared: Arc::new(Shared {
                queue: self.queue,
                ledger: self.ledger,
                policy: RetryPolicy { backoff: config.backoff },
                config,
                handlers: self.handlers,
                alerts: self.alerts,
                counters: Counters::default(),
                pace: Pace::default(),
                buffered: AtomicUsize::new(0),
                taken: Notify::new(),
                slots,
            }),
        }
    }
}

/// Runs handlers for claimed jobs, so that each key's effect happens once and each job that
/// cannot succeed ends as a failure record with one alert.
pub struct Worker<Q, L> {
    shared: Arc<Shared<Q, L>>,
}

struct Shared<Q, L> {
    queue: Q,
    ledger: L,
    config: WorkerConfig,
    policy: RetryPolicy,
    handlers: HashMap<String, Arc<dyn Erased>>,
    alerts: Vec<Arc<dyn AlertSink>>,
    counters: Counters,
    pace: Pace,
    /// Claimed jobs waiting for a handler, and a signal each time one is taken or a handler
    /// finishes (either makes room for a claim).
    buffered: AtomicUsize,
    taken: Notify,
    /// A permit per handler running.
    slots: Arc<Semaphore>,
}

impl<Q: Claim + 'static, L: Ledger + 'static> Worker<Q, L> {
    /// Starts building a worker over `queue` and `ledger` (often the same backend value).
    pub fn builder(queue: Q, ledger: L) -> WorkerBuilder<Q, L> {
        WorkerBuilder {
            queue,
            ledger,
            config: WorkerConfig::default(),
            set: Overrides::default(),
            handlers: HashMap::new(),
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
        let abandon = CancellationToken::new();
        let tracker = TaskTracker::new();
        let shared = Arc::clone(&self.shared);
        let counters: Arc<dyn Fn() -> WorkerStats + Send + Sync> = Arc::new(move || shared.counters.snapshot());
        let grace = self.shared.config.shutdown_grace;
        let main = tokio::spawn(claim_loop(self.shared, stop.clone(), abandon.clone(), tracker.clone()));
        RunningWorker { stop, abandon, tracker, main, grace, stats: counters }
    }

    /// Runs until `signal` resolves, then shuts down gracefully. Returns the final counters.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> WorkerStats {
        let running = self.start();
        signal.await;
        running.shutdown().await
    }
}

/// A started worker.
pub struct RunningWorker {
    stop: CancellationToken,
    abandon: CancellationToken,
    tracker: TaskTracker,
    main: tokio::task::JoinHandle<()>,
    grace: Duration,
    stats: Arc<dyn Fn() -> WorkerStats + Send + Sync>,
}

impl RunningWorker {
    /// What the worker has done so far.
    pub fn stats(&self) -> WorkerStats {
        (self.stats)()
    }

    /// Stops claiming, lets running handlers finish within the configured grace, then releases
    /// the jobs of those still running so another worker takes them at once.
    pub async fn shutdown(self) -> WorkerStats {
        let grace = self.grace;
        self.shutdown_within(grace).await
    }

    /// [`shutdown`](Self::shutdown) with an explicit grace (`Duration::ZERO`: release at once).
    pub async fn shutdown_within(self, grace: Duration) -> WorkerStats {
        self.stop.cancel();
        if let Err(e) = self.main.await {
            error!(error = %e, "worker claim loop panicked");
        }
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait()).await.is_err() {
            info!("shutdown grace over: releasing the jobs still running");
            self.abandon.cancel();
            self.tracker.wait().await;
        }
        (self.stats)()
    }
}

/// Every log event about a job carries its id, kind, attempt and key; never its payload.
fn job_span(claimed: &Claimed) -> tracing::Span {
    let job = &claimed.job;
    info_span!("job", id = %job.id, kind = %job.kind, attempt = job.attempt, key = %job.key)
}

/// Claims ahead of the running handlers: `claimers` claim calls in flight, each taking up to
/// `batch` jobs, into a buffer the dispatcher hands to at most `concurrency` handlers.
async fn claim_loop<Q: Claim + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    stop: CancellationToken,
    abandon: CancellationToken,
    tracker: TaskTracker,
) {
    let claimers = shared.config.claimers.max(1);
    let room = Arc::new(Semaphore::new(shared.config.batch.max(1) * claimers));
    let (buffer, waiting) = mpsc::unbounded_channel::<(Instant, Claimed)>();
    let dispatcher =
        tokio::spawn(dispatch(Arc::clone(&shared), waiting, Arc::clone(&room), stop.clone(), abandon, tracker));
    let claimers: Vec<_> = (0..claimers)
        .map(|_| tokio::spawn(claimer(Arc::clone(&shared), buffer.clone(), Arc::clone(&room), stop.clone())))
        .collect();
    drop(buffer);
    for claimer in claimers {
        if let Err(e) = claimer.await {
            error!(error = %e, "worker claimer panicked");
        }
    }
    if let Err(e) = dispatcher.await {
        error!(error = %e, "worker dispatcher panicked");
    }
}

/// One claim call at a time, for as many jobs as the handlers get through in about
/// [`CLAIM_AHEAD`] (at most `batch`), once the buffer has room for them.
async fn claimer<Q: Claim + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    buffer: mpsc::UnboundedSender<(Instant, Claimed)>,
    room: Arc<Semaphore>,
    stop: CancellationToken,
) {
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        // Wait for room for the whole claim: claiming whatever little room there is would turn
        // one full claim into many small ones (each an API request on SQS).
        let want = shared.claim_size();
        tokio::select! {
            permits = room.acquire_many(want as u32) => permits.expect("the semaphore is never closed").forget(),
            () = stop.cancelled() => break,
        }
        tokio::select! {
            () = shared.wait_for_pace(want) => {}
            () = stop.cancelled() => {
                room.add_permits(want);
                break;
            }
        }
        let claimed = match shared.queue.claim(want, shared.config.claim_lease(), shared.config.poll).await {
            Ok(claimed) => {
                failures = 0;
                claimed
            }
            Err(e) => {
                room.add_permits(want);
                shared.buffered.fetch_sub(want, Ordering::Relaxed); // the reservation
                failures += 1;
                let pause =
                    Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10), ..Backoff::default() };
                warn!(error = %e, "claim failed; pausing");
                tokio::select! {
                    () = tokio::time::sleep(pause.delay(failures)) => {}
                    () = stop.cancelled() => {}
                }
                continue;
            }
        };
        // The room and the reservation made for `want` become the jobs that came.
        let unfilled = want.saturating_sub(claimed.len());
        room.add_permits(unfilled);
        shared.buffered.fetch_sub(unfilled, Ordering::Relaxed);
        shared.counters.add(Count::Claimed, claimed.len() as u64);
        let now = Instant::now();
        for job in claimed {
            // The dispatcher outlives every claimer, so this cannot fail.
            let _ = buffer.send((now, job));
        }
    }
}

async fn dispatch<Q: Claim + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    mut waiting: mpsc::UnboundedReceiver<(Instant, Claimed)>,
    room: Arc<Semaphore>,
    stop: CancellationToken,
    abandon: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::clone(&shared.slots);
    // Jobs between dispatch and settlement. A handler's slot is freed as soon as it returns, so
    // settlements (batched by the backend) overlap the next handlers; this bounds how many wait.
    let outstanding =
        Arc::new(Semaphore::new((4 * shared.config.batch * shared.config.claimers).max(shared.config.concurrency)));
    // Jobs that shutdown caught before they started. They are handed back only once every
    // claimer has stopped, so no claim of this worker can take them again.
    let mut unstarted = Vec::new();
    while let Some((claimed_at, job)) = waiting.recv().await {
        room.add_permits(1);
        let permits = tokio::select! {
            permits = async {
                let out = Arc::clone(&outstanding).acquire_owned().await;
                let slot = Arc::clone(&slots).acquire_owned().await;
                out.and_then(|out| slot.map(|slot| (out, slot)))
            }, if !stop.is_cancelled() => Some(permits.expect("the semaphores are never closed")),
            () = stop.cancelled() => None,
        };
        // Counted as waiting until it has its handler slot, so that no claim is made for the
        // slot it is about to take.
        shared.buffered.fetch_sub(1, Ordering::Relaxed);
        shared.taken.notify_waiters();
        let Some((out, slot)) = permits else {
            unstarted.push(job);
            continue;
        };
        let span = job_span(&job);
        let shared = Arc::clone(&shared);
        if claimed_at.elapsed() >= shared.config.claim_lease() / 2 {
            // It waited in the buffer for half its claim lease: give it back rather than run it
            // on a lease about to lapse.
            tracker.spawn(async move { shared.give_back(&job).await }.instrument(span));
            continue;
        }
        let abandon = abandon.clone();
        tracker.spawn(
            async move {
                shared.process(job, slot, abandon).await;
                drop(out);
            }
            .instrument(span),
        );
    }
    for job in unstarted {
        let span = job_span(&job);
        let shared = Arc::clone(&shared);
        tracker.spawn(async move { shared.give_back(&job).await }.instrument(span));
    }
}

impl<Q: Claim, L: Ledger> Shared<Q, L> {
    /// How many jobs may wait claimed: what the handlers get through in [`CLAIM_AHEAD`], or
    /// as many as there are idle handlers, whichever is more. Slow jobs are thus claimed only for
    /// a handler that is free, never to wait behind a running one for longer than their claim
    /// lease.
    fn room(&self) -> usize {
        self.pace.ahead(&self.config).max(self.slots.available_permits())
    }

    /// Jobs to ask for in one claim: the claimers' share of the [`room`](Self::room), rounded up
    /// to a power of two (a backend may prepare a statement per size: it sees few), at most
    /// `batch`.
    fn claim_size(&self) -> usize {
        let batch = self.config.batch.max(1);
        self.room().div_ceil(self.config.claimers.max(1)).min(batch).next_power_of_two().min(batch)
    }

    /// Waits until a claim of `want` more jobs keeps the buffer within the [`room`](Self::room),
    /// then reserves their places (in `buffered`), so that two claimers never both claim for
    /// the same idle handler.
    async fn wait_for_pace(&self, want: usize) {
        loop {
            let taken = self.taken.notified();
            let mut taken = std::pin::pin!(taken);
            // Registered before looking, so a job taken in between is not missed.
            taken.as_mut().enable();
            let buffered = self.buffered.load(Ordering::Relaxed);
            if buffered + want <= self.room() {
                let reserved =
                    self.buffered.compare_exchange(buffered, buffered + want, Ordering::AcqRel, Ordering::Relaxed);
                if reserved.is_ok() {
                    return;
                }
                continue; // another claimer reserved meanwhile: look again
            }
            taken.await;
        }
    }

    async fn give_back(&self, claimed: &Claimed) {
        debug!("handed back before it started");
        self.counters.add(Count::HandedBack, 1);
        self.settle(self.queue.release(&claimed.lease).await);
    }

    async fn process(&self, claimed: Claimed, slot: OwnedSemaphorePermit, abandon: CancellationToken) {
        let job = &claimed.job;
        if let Some(why) = &job.undecodable {
            // The backend could not read it: its kind and payload are stand-ins, so no handler
            // may see it, whatever kind it claims. Reading it again cannot succeed: no retries.
            return self.dead_letter(&claimed, why).await;
        }
        let Some(handler) = self.handlers.get(&job.kind) else {
            return self.dead_letter(&claimed, &format!("no handler is registered for kind `{}`", job.kind)).await;
        };
        let begin = self.ledger.begin(&job.key, &job.payload, self.config.lease).await;
        let (hold, earlier_attempt_pending) = match begin {
            Ok(Begin::Fresh(hold)) => (hold, false),
            Ok(Begin::Resumed(hold)) => (hold, true),
            Ok(Begin::Done(_)) => {
                info!("skipped: the effect of this key is already done");
                self.counters.add(Count::Skipped, 1);
                return self.settle(self.queue.complete(&claimed.lease).await);
            }
            Ok(Begin::Busy(held_for)) => {
                // Not a failure, and never a dead letter: another attempt is doing the work. Look
                // again when its hold ends, not sooner: each look costs a delivery (a receive on
                // SQS, counted by its redrive policy), and nothing waits on this copy but its own
                // acknowledgement. A holder that dies lets the hold lapse, and then this copy runs.
                // At most a third of the lease: a hold far longer than the worker's own (taken by
                // a direct `Ledger::begin`) and released early is not waited out whole.
                let delay = held_for.min(self.config.lease / 3) + Duration::from_millis(10);
                info!(retry_in_ms = delay.as_millis() as u64, "deferred: another attempt holds this key");
                self.counters.add(Count::Deferred, 1);
                return self
                    .settle(self.queue.retry(&claimed.lease, delay, "deferred: another attempt held the key").await);
            }
            Err(e) if e.kind() == ErrorKind::KeyConflict => {
                return self.dead_letter(&claimed, &format!("key reused with a different payload: {e}")).await;
            }
            Err(e) => {
                let outcome = Outcome::Retry { after: None, error: format!("effect ledger unavailable: {e}") };
                return self.decide(&claimed, outcome).await;
            }
        };
        if job.attempt > job.cap {
            // A worker died holding the lease on the last attempt: no attempt is left.
            let _ = self.ledger.release_hold(&hold).await;
            let error = format!(
                "attempt {} is past the cap of {}: the last attempt's worker lost its lease",
                job.attempt, job.cap
            );
            return self.dead_letter(&claimed, &error).await;
        }
        let ctx = JobContext {
            job_id: job.id.clone(),
            kind: job.kind.clone(),
            attempt: job.attempt,
            cap: job.cap,
            key: job.key.clone(),
            provider_key: job.provider_key,
            earlier_attempt_pending,
        };
        let run = match handler.prepare(&job.payload, ctx) {
            Ok(run) => run,
            Err(e) => {
                let _ = self.ledger.release_hold(&hold).await;
                // Decoding again cannot succeed: no retries.
                return self.dead_letter(&claimed, &format!("payload does not decode: {e}")).await;
            }
        };
        let started = Instant::now();
        let result = self.run_with_heartbeat(&claimed, &hold, run, &abandon).await;
        self.pace.record(started.elapsed());
        drop(slot); // the handler is done: the next one may start while this one settles
        self.taken.notify_waiters(); // an idle handler is room for a claim
        let Some(result) = result else {
            let _ = self.ledger.release_hold(&hold).await;
            info!("interrupted by shutdown; released for another worker");
            self.counters.add(Count::Released, 1);
            // The handler started, so the attempt counts, like any failed one.
            return self.settle(self.queue.retry(&claimed.lease, Duration::ZERO, "interrupted by shutdown").await);
        };
        let settle = async {
            let outcome = match result {
                Ok(value) => {
                    if let Err(e) = self.ledger.finish(&hold, &value).await {
                        // The effect happened; a next delivery would see the key pending and resume.
                        error!(error = %e, "could not mark the effect done in the ledger");
                    }
                    Outcome::Done(value)
                }
                Err(err) => {
                    let _ = self.ledger.release_hold(&hold).await;
                    match err.retry_delay() {
                        Some(after) => Outcome::Retry { after, error: err.message().to_owned() },
                        None => Outcome::Fail { error: err.message().to_owned() },
                    }
                }
            };
            self.decide(&claimed, outcome).await;
        };
        tokio::select! {
            () = settle => {}
            () = self.keep_lease_while_settling(&claimed) => unreachable!("it never returns"),
        }
    }

    /// Beside a settlement that takes long (a database stall), keeps the job's lease alive: a
    /// quick handler's job is still on its short claim lease, and must not be taken again while
    /// its result is being written. A settlement done within a third of the claim lease (almost
    /// all of them) costs a timer and nothing more.
    async fn keep_lease_while_settling(&self, claimed: &Claimed) {
        let every = (self.config.claim_lease() / 3).max(Duration::from_millis(10));
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.queue.extend(&claimed.lease, self.config.lease).await {
                debug!(error = %e, "could not extend the lease of a job being settled");
            }
        }
    }

    /// Runs the handler, extending the lease and the ledger hold while it runs. `None` when
    /// shutdown abandoned it.
    async fn run_with_heartbeat(
        &self,
        claimed: &Claimed,
        hold: &Hold,
        run: BoxFuture<'static, HandlerResult>,
        abandon: &CancellationToken,
    ) -> Option<HandlerResult> {
        let mut run = AssertUnwindSafe(run).catch_unwind();
        let finished = |result: std::thread::Result<HandlerResult>| result.unwrap_or_else(|p| Err(panicked(p)));
        // A handler that is done at its first poll needs no heartbeat timer. (That poll has a
        // no-op waker; a pending handler is polled again at once below, with the real one.)
        if let Some(result) = (&mut run).now_or_never() {
            return Some(finished(result));
        }
        tokio::select! {
            result = &mut run => Some(finished(result)),
            () = self.keep_alive(claimed, hold) => unreachable!("keep_alive never returns"),
            () = abandon.cancelled() => None,
        }
    }

    /// For as long as a handler runs (polled beside it, so it never holds the handler up): moves
    /// its job from the claim lease to the full lease, then keeps the ledger hold alive and, with
    /// the heartbeat on, the lease.
    async fn keep_alive(&self, claimed: &Claimed, hold: &Hold) {
        let config = &self.config;
        // Until it takes: once the claim lease lapses, another worker may start the job.
        while config.claim_lease() < config.lease {
            match self.queue.extend(&claimed.lease, config.lease).await {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    warn!("the job's claim lease lapsed before its handler started; another worker may run it");
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "could not move the job to its full lease; trying again");
                    tokio::time::sleep(config.claim_lease() / 4).await;
                }
            }
        }
        // The ledger hold is kept alive for as long as the handler runs, heartbeat or not: it
        // says "an attempt is alive", so a redelivery meanwhile waits instead of repeating the
        // effect. The lease is extended only with the heartbeat on.
        let every = config.heartbeat.unwrap_or(config.lease / 3).max(Duration::from_millis(10));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            beat.tick().await;
            if let Err(e) = self.ledger.extend_hold(hold, config.lease).await {
                warn!(error = %e, "could not extend the key's hold; a redelivery may repeat the effect");
            }
            if config.heartbeat.is_some()
                && let Err(e) = self.queue.extend(&claimed.lease, config.lease).await
            {
                warn!(error = %e, "heartbeat failed; another worker may take this job");
            }
        }
    }

    async fn decide(&self, claimed: &Claimed, outcome: Outcome) {
        let job = &claimed.job;
        match self.policy.decide(job.attempt, job.cap, &outcome) {
            Decision::Complete => {
                debug!("done");
                self.counters.add(Count::Succeeded, 1);
                self.settle(self.queue.complete(&claimed.lease).await);
            }
            Decision::RetryIn(delay) => {
                let error = error_of(&outcome);
                warn!(error, retry_in_ms = delay.as_millis() as u64, "attempt failed; retrying");
                self.counters.add(Count::Retried, 1);
                self.settle(self.queue.retry(&claimed.lease, delay, error).await);
            }
            Decision::DeadLetter => self.dead_letter(claimed, error_of(&outcome)).await,
        }
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) {
        let record = match self.queue.dead_letter(claimed, error).await {
            Ok(record) => record,
            Err(e) => return self.settle(Err(e)),
        };
        warn!(record = %record.id, error, "failure record written");
        self.counters.add(Count::DeadLettered, 1);
        let alert = Alert { record, raised_at: Utc::now() };
        for sink in &self.alerts {
            if let Err(e) = sink.send(&alert).await {
                // The record is stored; the open-record count still shows it.
                error!(error = %e, record = %alert.record.id, "alert not delivered");
            }
        }
    }

    fn settle(&self, result: crate::Result<()>) {
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                warn!("lease lost: another worker holds this job now; nothing was changed");
                self.counters.add(Count::LeaseLost, 1);
            }
            Err(e) => error!(error = %e, "could not settle the job; it returns after its lease"),
        }
    }
}

fn error_of(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Done(_) => "",
        Outcome::Retry { error, .. } | Outcome::Fail { error } => error,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;
    use crate::backend::{DeadLetter, Enqueue, EnqueueExt, FailureQuery};
    use crate::error::Error;
    use crate::job::NewJob;
    use crate::key::{IdempotencyKey, KeyBuilder};
    use crate::memory::MemoryBackend;

    #[derive(Serialize, Deserialize)]
    struct Ping {
        n: u32,
    }

    impl Job for Ping {
        const KIND: &'static str = "ping";
        const CAP: Option<u32> = Some(3);
        fn key(&self, key: KeyBuilder) -> KeyBuilder {
            key.fact("n", self.n)
        }
    }

    struct FailingSink;

    impl AlertSink for FailingSink {
        fn send<'a>(&'a self, _alert: &'a Alert) -> BoxFuture<'a, crate::Result<()>> {
            Box::pin(async { Err(Error::temporary("webhook down")) })
        }
    }

    fn fast() -> WorkerConfig {
        WorkerConfig { backoff: Backoff::NONE, poll: Duration::from_millis(50), ..WorkerConfig::default() }
    }

    async fn records(backend: &MemoryBackend, n: usize) -> Vec<crate::FailureRecord> {
        for _ in 0..200 {
            let list = backend.list(&FailureQuery::open()).await.unwrap();
            if list.len() >= n {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} failure records");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_share_slow_jobs_instead_of_one_claiming_them_all() {
        let backend = MemoryBackend::new();
        for n in 0..40 {
            backend.enqueue_job(&Ping { n }).await.unwrap();
        }
        let slow = |_job: Ping, _ctx: JobContext| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, JobError>(())
        };
        let config = WorkerConfig { concurrency: 2, ..fast() };
        let start = |backend: &MemoryBackend| {
            Worker::builder(backend.clone(), backend.clone())
                .config(config.clone())
                .handle::<Ping>(slow)
                .build()
                .start()
        };
        let first = start(&backend);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = start(&backend);
        let all_done = async {
            while first.stats().succeeded + second.stats().succeeded < 40 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(15), all_done).await.expect("all 40 jobs run");
        let (first, second) = (first.shutdown().await, second.shutdown().await);
        // One worker claiming a full batch would have left the second with nothing to do.
        assert!(
            second.succeeded >= 10,
            "the later worker ran {} of 40; the first {}",
            second.succeeded,
            first.succeeded
        );
        assert_eq!(first.handed_back + second.handed_back, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_jobs_are_claimed_for_free_handlers_only_never_to_wait_out_their_claim_lease() {
        let backend = MemoryBackend::new();
        for n in 0..4 {
            backend.enqueue_job(&Ping { n }).await.unwrap();
        }
        let runs = Arc::new(Mutex::new(0));
        let counter = Arc::clone(&runs);
        let config = WorkerConfig {
            concurrency: 1,
            claim_lease: Duration::from_millis(300),
            lease: Duration::from_secs(10),
            ..fast()
        };
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(config)
            .handle::<Ping>(move |_job: Ping, _ctx: JobContext| {
                *counter.lock().unwrap() += 1;
                async {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, JobError>(())
                }
            })
            .build()
            .start();
        for _ in 0..300 {
            if worker.stats().succeeded == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = worker.shutdown().await;
        // A job claimed behind a running 500 ms handler would wait past half its 300 ms claim
        // lease and be handed back, costing a receive on SQS each time.
        assert_eq!((stats.succeeded, stats.claimed, stats.handed_back, *runs.lock().unwrap()), (4, 4, 0, 4));
    }

    #[tokio::test]
    async fn a_kind_without_a_handler_is_dead_lettered_at_once() {
        let backend = MemoryBackend::new();
        let key = IdempotencyKey::builder("unknown").fact("n", 1).build().unwrap();
        backend.enqueue(NewJob::new("unknown", key, json!({})).unwrap()).await.unwrap();
        let worker = Worker::builder(backend.clone(), backend.clone()).config(fast()).build().start();
        let record = records(&backend, 1).await.remove(0);
        worker.shutdown().await;
        assert_eq!(record.attempts, 1);
        assert!(record.last_error.contains("no handler"), "{}", record.last_error);
    }

    #[tokio::test]
    async fn a_panicking_handler_is_retried_to_the_cap() {
        let backend = MemoryBackend::new();
        backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
        let runs = Arc::new(Mutex::new(0));
        let counter = Arc::clone(&runs);
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(move |_job: Ping, _ctx: JobContext| {
                *counter.lock().unwrap() += 1;
                async move {
                    if true {
                        panic!("bug in the handler");
                    }
                    Ok::<_, JobError>(())
                }
            })
            .build()
            .start();
        let record = records(&backend, 1).await.remove(0);
        worker.shutdown().await;
        assert_eq!((record.attempts, *runs.lock().unwrap()), (3, 3));
        assert!(record.last_error.contains("the handler panicked: bug in the handler"), "{}", record.last_error);
    }

    #[tokio::test]
    async fn a_handler_panicking_before_its_future_is_a_failed_attempt_with_its_message() {
        let backend = MemoryBackend::new();
        backend.enqueue_job(&Ping { n: 1 }).await.unwrap();
        let runs = Arc::new(Mutex::new(0));
        let counter = Arc::clone(&runs);
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(move |job: Ping, _ctx: JobContext| {
                *counter.lock().unwrap() += 1;
                if job.n > 0 {
                    // A `String` payload, as a formatted panic has.
                    panic!("no limit configured for ping {}", job.n);
                }
                async move { Ok::<_, JobError>(()) }
            })
            .build()
            .start();
        let record = records(&backend, 1).await.remove(0);
        let stats = worker.shutdown().await;
        assert_eq!((record.attempts, *runs.lock().unwrap(), stats.retried), (3, 3, 2), "every attempt ran and failed");
        assert!(
            record.last_error.contains("the handler panicked: no limit configured for ping 1"),
            "{}",
            record.last_error
        );
        assert!(record.errors.iter().all(|e| e.error.contains("no limit configured")), "{:?}", record.errors);
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Charge {
        order: u32,
        card: Card,
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Card {
        number: u64,
    }

    impl Job for Charge {
        const KIND: &'static str = "charge";
        fn key(&self, key: KeyBuilder) -> KeyBuilder {
            key.fact("order", self.order)
        }
    }

    /// Every alert's summary (the webhook's text), kept.
    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<String>>>);

    impl AlertSink for Collect {
        fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, crate::Result<()>> {
            self.0.lock().unwrap().push(alert.summary());
            Box::pin(async { Ok(()) })
        }
    }

    /// Tracing output, as a subscriber writing into a buffer gets it.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_payload_that_does_not_decode_is_named_by_field_never_by_value() {
        const CANARY: &str = "4111111111111111";
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        // The test's runtime is single-threaded: the worker's tasks log through this subscriber.
        let _logging = tracing::subscriber::set_default(subscriber);
        let backend = MemoryBackend::new();
        let key = IdempotencyKey::builder("charge").fact("order", 7).build().unwrap();
        let payload = json!({"order": 7, "card": {"number": CANARY}});
        backend.enqueue(NewJob::new("charge", key, payload.clone()).unwrap()).await.unwrap();
        let alerts = Collect::default();
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Charge>(|_job: Charge, _ctx: JobContext| async { Ok::<_, JobError>(()) })
            .alert(alerts.clone())
            .alert(TracingAlerts)
            .build()
            .start();
        let record = records(&backend, 1).await.remove(0);
        worker.shutdown().await;
        assert_eq!(record.payload, payload, "the record keeps the payload, for a replay");
        assert_eq!(record.attempts, 1);
        assert_eq!(
            record.last_error,
            "payload does not decode: field `card.number`: invalid type: string, expected u64"
        );
        let alerts = alerts.0.lock().unwrap().join("\n");
        assert!(alerts.contains("field `card.number`"), "{alerts}");
        let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(logs.contains("failure record written"), "the subscriber saw the worker: {logs}");
        for (what, text) in [("last error", &record.last_error), ("alert", &alerts), ("logs", &logs)] {
            assert!(!text.contains(CANARY), "the {what} quotes the payload: {text}");
        }
    }

    #[test]
    fn builder_setters_compose_in_any_order_and_with_a_base_config() {
        let backend = MemoryBackend::new();
        let base =
            WorkerConfig { concurrency: 16, batch: 64, poll: Duration::from_millis(5), ..WorkerConfig::default() };
        let built = |b: WorkerBuilder<MemoryBackend, MemoryBackend>| b.build().config().clone();
        let before = built(
            Worker::builder(backend.clone(), backend.clone())
                .concurrency(2)
                .heartbeat(Some(Duration::from_secs(1)))
                .claimers(1)
                .config(base.clone())
                .lease(Duration::from_secs(9))
                .batch(10)
                .poll(Duration::from_millis(250))
                .shutdown_grace(Duration::from_secs(3)),
        );
        let after = built(
            Worker::builder(backend.clone(), backend.clone())
                .config(base.clone())
                .shutdown_grace(Duration::from_secs(3))
                .poll(Duration::from_millis(250))
                .batch(10)
                .lease(Duration::from_secs(9))
                .claimers(1)
                .heartbeat(Some(Duration::from_secs(1)))
                .concurrency(2),
        );
        for config in [&before, &after] {
            assert_eq!((config.concurrency, config.batch, config.claimers), (2, 10, 1));
            assert_eq!((config.lease, config.heartbeat), (Duration::from_secs(9), Some(Duration::from_secs(1))));
            assert_eq!((config.poll, config.shutdown_grace), (Duration::from_millis(250), Duration::from_secs(3)));
        }
        // Without a heartbeat setter, the heartbeat follows the lease; off in the base stays off.
        let follows = built(Worker::builder(backend.clone(), backend.clone()).lease(Duration::from_secs(9)));
        assert_eq!(follows.heartbeat, Some(Duration::from_secs(3)));
        let off = WorkerConfig { heartbeat: None, ..base };
        let stays_off =
            built(Worker::builder(backend.clone(), backend.clone()).lease(Duration::from_secs(9)).config(off));
        assert_eq!((stays_off.heartbeat, stays_off.concurrency), (None, 16));
    }

    #[tokio::test]
    async fn a_failing_alert_sink_keeps_the_record_and_permanent_errors_do_not_retry() {
        let backend = MemoryBackend::new();
        backend.enqueue_job(&Ping { n: 2 }).await.unwrap();
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("card declined")) })
            .alert(FailingSink)
            .build()
            .start();
        let record = records(&backend, 1).await.remove(0);
        let stats = worker.shutdown().await;
        assert_eq!((record.attempts, stats.retried, stats.dead_lettered), (1, 0, 1));
        assert_eq!(backend.count_open().await.unwrap(), 1, "the record outlives the failed alert");
    }

    #[tokio::test]
    async fn a_closure_is_an_alert_sink() {
        let backend = MemoryBackend::new();
        backend.enqueue_job(&Ping { n: 4 }).await.unwrap();
        let alerts = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&alerts);
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(|_job: Ping, _ctx: JobContext| async { Err::<(), _>(JobError::permanent("card declined")) })
            .alert_fn(move |alert: Alert| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().unwrap().push((alert.record.id.clone(), alert.summary()));
                    Ok(())
                }
            })
            .build()
            .start();
        let record = records(&backend, 1).await.remove(0);
        worker.shutdown().await;
        let alerts = alerts.lock().unwrap();
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        assert_eq!(alerts[0].0, record.id);
        assert!(alerts[0].1.contains("card declined"), "{}", alerts[0].1);
    }

    #[tokio::test]
    async fn counts_show_queued_and_running_jobs_until_the_queue_drains() {
        use crate::backend::{Counts, QueueStats, QueueStatsExt};
        let backend = MemoryBackend::new();
        for n in 0..4 {
            backend.enqueue_job(&Ping { n }).await.unwrap();
        }
        assert_eq!(backend.counts().await.unwrap(), Counts { queued: 4, running: 0 });
        let held = backend.claim(1, Duration::from_secs(30), Duration::ZERO).await.unwrap().remove(0);
        assert_eq!(backend.counts().await.unwrap(), Counts { queued: 3, running: 1 });
        let left = backend.wait_until_drained(Duration::from_millis(100)).await.unwrap();
        assert_eq!(left, Counts { queued: 3, running: 1 }, "nothing works the queue yet");
        backend.release(&held.lease).await.unwrap();
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(|_job: Ping, _ctx: JobContext| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, JobError>(())
            })
            .build()
            .start();
        let drained = backend.wait_until_drained(Duration::from_secs(10)).await.unwrap();
        let stats = worker.shutdown().await;
        assert!(drained.is_drained(), "{drained:?}");
        assert_eq!(stats.succeeded, 4, "drained means every job finished");
    }

    #[tokio::test]
    async fn a_requested_retry_delay_is_honoured() {
        let backend = MemoryBackend::new();
        backend.enqueue_job(&Ping { n: 3 }).await.unwrap();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&starts);
        let worker = Worker::builder(backend.clone(), backend.clone())
            .config(fast())
            .handle::<Ping>(move |_job: Ping, ctx: JobContext| {
                seen.lock().unwrap().push(Instant::now());
                async move {
                    if ctx.attempt == 1 {
                        return Err(JobError::retry_after(Duration::from_millis(300), "429 Too Many Requests"));
                    }
                    Ok(())
                }
            })
            .build()
            .start();
        for _ in 0..200 {
            if starts.lock().unwrap().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        worker.shutdown().await;
        let starts = starts.lock().unwrap();
        assert_eq!(starts.len(), 2);
        assert!(starts[1] - starts[0] >= Duration::from_millis(300));
    }
}
