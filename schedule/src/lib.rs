//! Scheduled jobs: a cron job that fires twice is the same problem as a job delivered twice,
//! with the period in the key. Each run is enqueued with its period (the time it is due, in
//! UTC) as a fact of its idempotency key, so any number of schedulers, on any number of machines,
//! enqueue one job per period (`daily_report:team=1:period=20261201T060000Z`): the backend's enqueue dedupe (or, on a broker, the effect ledger)
//! keeps the rest to nothing.
//!
//! ```no_run
//! # use redrive_core::{Job, KeyBuilder};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct DailyReport { team: u32 }
//! # impl Job for DailyReport { const KIND: &'static str = "daily_report";
//! #     fn key(&self, key: KeyBuilder) -> KeyBuilder { key.fact("team", self.team) } }
//! # async fn run(queue: redrive_core::MemoryBackend) -> redrive_core::Result<()> {
//! use redrive_schedule::{Missed, Scheduler};
//!
//! Scheduler::new(queue)
//!     // Seconds, minutes, hours, day of month, month, day of week: 07:00 every day in Paris.
//!     .every("0 0 7 * * *", chrono_tz::Europe::Paris, Missed::CatchUpLast, |_due| DailyReport { team: 1 })?
//!     .run_until(redrive_core::stop_signal())
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # Missed periods
//!
//! A scheduler that was down (a deploy, a crash) finds periods that came due while it was away.
//! [`Missed::Skip`] enqueues none of them and waits for the next. [`Missed::CatchUpLast`] enqueues
//! the most recent one (never older ones: a report for yesterday's 07:00 still matters; seven
//! of them at once do not), and the key makes that a no-op if another scheduler enqueued it.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use redrive_core::{Enqueue, Error, ErrorKind, IdempotencyKey, Job, NewJob, Result};
use tracing::{info, warn};

/// What a scheduler does about periods that came due while it was not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Enqueue none; wait for the next period.
    Skip,
    /// Enqueue the most recent missed period (once, whatever the number of schedulers), then
    /// wait for the next.
    CatchUpLast,
}

type Make = Arc<dyn Fn(DateTime<Tz>) -> Result<NewJob> + Send + Sync>;

struct Entry {
    kind: &'static str,
    cron: cron::Schedule,
    zone: Tz,
    missed: Missed,
    make: Make,
}

/// Cron schedules that enqueue on one queue.
pub struct Scheduler<Q> {
    queue: Q,
    entries: Vec<Entry>,
    clock: Clock,
}

/// Where a scheduler reads the time: the system's clock, or (for tests) one that starts at a
/// chosen instant and advances with tokio's clock, which a test can pause and move.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Option<(DateTime<Utc>, tokio::time::Instant)>,
}

impl Clock {
    /// The system's clock.
    pub fn system() -> Self {
        Self { start: None }
    }

    /// A clock that reads `at` now and advances with tokio's clock: under
    /// `#[tokio::test(start_paused = true)]` a scheduler's days pass in an instant.
    pub fn starting_at(at: DateTime<Utc>) -> Self {
        Self { start: Some((at, tokio::time::Instant::now())) }
    }

    /// The time now.
    pub fn now(&self) -> DateTime<Utc> {
        match self.start {
            None => Utc::now(),
            Some((at, then)) => at + then.elapsed(),
        }
    }

    /// Sleeps until `at` (at once if it is past).
    async fn sleep_until(&self, at: DateTime<Utc>) {
        // Again after waking: a wall clock may have been set back meanwhile.
        while let Ok(wait) = (at - self.now()).to_std() {
            if wait.is_zero() {
                return;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// How a period appears in a key: `20261201T070000Z`.
pub const PERIOD_FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// The job `job` for the period due at `due`: its own key with the period (in UTC,
/// [`PERIOD_FORMAT`]) added.
pub fn job_for_period<J: Job>(job: &J, due: DateTime<Utc>) -> Result<NewJob> {
    let mut new = NewJob::from_job(job)?;
    // ISO 8601's basic format: readable, and nothing in it needs escaping in a key.
    let period = due.format(PERIOD_FORMAT).to_string();
    new.key = job.key(IdempotencyKey::builder(J::KIND)).fact("period", period).build()?;
    Ok(new)
}

impl<Q: Enqueue> Scheduler<Q> {
    /// A scheduler with no schedules, enqueueing on `queue`.
    pub fn new(queue: Q) -> Self {
        Self { queue, entries: Vec::new(), clock: Clock::system() }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Enqueues `make(due)` at each time `cron` names in `zone` (a cron expression with seconds:
    /// `sec min hour day-of-month month day-of-week [year]`), with the period in its key.
    pub fn every<J: Job>(
        mut self,
        cron: &str,
        zone: Tz,
        missed: Missed,
        make: impl Fn(DateTime<Tz>) -> J + Send + Sync + 'static,
    ) -> Result<Self> {
        let cron = cron::Schedule::from_str(cron)
            .map_err(|e| Error::new(ErrorKind::Config, format!("the cron expression {cron:?} does not parse: {e}")))?;
        let make: Make = Arc::new(move |due: DateTime<Tz>| job_for_period(&make(due), due.with_timezone(&Utc)));
        self.entries.push(Entry { kind: J::KIND, cron, zone, missed, make });
        Ok(self)
    }

    /// Runs every schedule until `stop` completes.
    pub async fn run_until(self, stop: impl Future<Output = ()>) {
        let Self { queue, entries, clock } = self;
        let runs = futures_util::future::join_all(entries.iter().map(|entry| run_one(&queue, entry, clock)));
        tokio::select! {
            _ = runs => {}
            () = stop => {}
        }
    }
}

async fn run_one<Q: Enqueue>(queue: &Q, entry: &Entry, clock: Clock) {
    let now = clock.now().with_timezone(&entry.zone);
    if entry.missed == Missed::CatchUpLast {
        // The last period due before now: the first upcoming one's predecessor.
        let last = entry.cron.after(&now).next_back();
        if let Some(due) = last.filter(|due| *due <= now) {
            enqueue(queue, entry, due).await;
        }
    }
    let mut after = now;
    loop {
        let Some(due) = entry.cron.after(&after).next() else {
            info!(kind = entry.kind, "the schedule has no more periods");
            return;
        };
        clock.sleep_until(due.with_timezone(&Utc)).await;
        enqueue(queue, entry, due).await;
        after = due;
    }
}

async fn enqueue<Q: Enqueue>(queue: &Q, entry: &Entry, due: DateTime<Tz>) {
    let job = match (entry.make)(due) {
        Ok(job) => job,
        Err(e) => return warn!(kind = entry.kind, error = %e, "the scheduled job could not be built"),
    };
    let key = job.key.clone();
    match queue.enqueue(job).await {
        Ok(done) if done.is_created() => info!(kind = entry.kind, key = %key, "scheduled run enqueued"),
        Ok(_) => info!(kind = entry.kind, key = %key, "scheduled run already enqueued by another scheduler"),
        Err(e) => warn!(kind = entry.kind, key = %key, error = %e, "scheduled run not enqueued"),
    }
}
