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
//!
//! # Failed enqueues
//!
//! An enqueue that fails for a temporary reason (a dropped connection, a failover, throttling) is
//! tried again with exponential backoff and jitter (100 ms doubling to 30 s) until the period's
//! run is enqueued or the next period begins; the key keeps a retry whose first try did land to
//! one job. A period still failing then is lost: logged as an error (kind and key, never the
//! payload) and counted. A scheduler that wakes late still gives each period one try. A permanent failure (a payload too large, a key conflict)
//! is logged and counted at once, not retried. [`Scheduler::run_until`] returns the counts
//! ([`ScheduleStats`]), and the `metrics` facade gets them as
//! `redrive_scheduled_runs_total{kind, outcome}`: alert on `outcome="lost"` and `"failed"`.
//!
//! # Daylight saving
//!
//! A schedule in a zone with daylight saving runs each local time it names once:
//!
//! - A local time the zone skips (02:30 on the night New York springs forward from 02:00 to
//!   03:00) is due at the end of the gap (03:00 local): a daily job still runs that day. Every
//!   time that falls there (02:00 to 02:45 and 03:00 itself, for a job every 15 minutes) is one
//!   run.
//! - A local time the zone repeats (01:30 on the night New York falls back from 02:00 to 01:00)
//!   is due at its first occurrence only: a daily job runs once, not twice, and an hourly job
//!   skips the repeated hour's second pass.
//!
//! The key's period is that instant, in UTC: one run per instant, none twice.
//! Work that must run every so much real time (every hour, whatever the clocks say) belongs in
//! `chrono_tz::UTC`, which has no transitions.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use redrive_core::{Enqueue, Enqueued, Error, ErrorKind, IdempotencyKey, Job, NewJob, Result};
use tracing::{error, info, warn};

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

    /// Runs every schedule until `stop` completes; what the runs came to.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> ScheduleStats {
        let Self { queue, entries, clock } = self;
        let counters = Counters::default();
        let runs = futures_util::future::join_all(entries.iter().map(|entry| run_one(&queue, entry, clock, &counters)));
        tokio::select! {
            _ = runs => {}
            () = stop => {}
        }
        counters.snapshot()
    }
}

/// What a scheduler's runs came to, over all its schedules. The same counts go to the `metrics`
/// facade as `redrive_scheduled_runs_total{kind, outcome}` (outcome: `enqueued`, `duplicate`,
/// `retried`, `lost`, `failed`), for a Prometheus recorder to serve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Periods whose run this scheduler enqueued.
    pub enqueued: u64,
    /// Periods whose key found a job already: another scheduler's, or an earlier try's whose
    /// answer was lost (or a run that failed for good, its record kept).
    pub duplicates: u64,
    /// Enqueues tried again after a temporary failure.
    pub retries: u64,
    /// Periods whose enqueue still failed for a temporary reason when the next period began:
    /// that period's run was never enqueued.
    pub lost: u64,
    /// Periods whose enqueue failed for a permanent reason (or whose job could not be built):
    /// not retried, since the same call would fail the same way.
    pub failed: u64,
}

#[derive(Default)]
struct Counters([AtomicU64; 5]);

#[derive(Clone, Copy)]
enum Outcome {
    Enqueued,
    Duplicate,
    Retried,
    Lost,
    Failed,
}

impl Counters {
    fn add(&self, kind: &'static str, outcome: Outcome) {
        self.0[outcome as usize].fetch_add(1, Ordering::Relaxed);
        let name = match outcome {
            Outcome::Enqueued => "enqueued",
            Outcome::Duplicate => "duplicate",
            Outcome::Retried => "retried",
            Outcome::Lost => "lost",
            Outcome::Failed => "failed",
        };
        metrics::counter!("redrive_scheduled_runs_total", "kind" => kind, "outcome" => name).increment(1);
    }

    fn snapshot(&self) -> ScheduleStats {
        let [enqueued, duplicates, retries, lost, failed] = self.0.each_ref().map(|n| n.load(Ordering::Relaxed));
        ScheduleStats { enqueued, duplicates, retries, lost, failed }
    }
}

/// A cron schedule in a zone, read as instants: each local time it names once. A local time the
/// zone skips (spring forward) is due at the first instant after the gap; a local time it
/// repeats (fall back) is due at its first occurrence only.
struct Periods<'a> {
    cron: &'a cron::Schedule,
    zone: Tz,
}

impl Periods<'_> {
    /// The local times the cron names from `local` on, strictly after it. The cron runs in UTC,
    /// where no time is skipped or repeated, so that every local time comes once.
    fn local_times_after(&self, local: NaiveDateTime) -> impl Iterator<Item = NaiveDateTime> + '_ {
        self.cron.after(&local.and_utc()).map(|at| at.naive_utc())
    }

    /// When the local time `local` is due. Non-decreasing in `local`, so the first local time
    /// whose instant is past a given one is found by walking forward.
    fn instant(&self, local: NaiveDateTime) -> DateTime<Utc> {
        match self.zone.from_local_datetime(&local) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => at.with_timezone(&Utc),
            LocalResult::None => self.gap_end(local),
        }
    }

    /// The first instant whose local time is past `local`, a time the zone skips: the end of
    /// the gap (03:00 for 02:30 on a spring-forward night). A bisection over the two days
    /// around it, to the second (zones change offsets on whole seconds).
    fn gap_end(&self, local: NaiveDateTime) -> DateTime<Utc> {
        let day = chrono::TimeDelta::days(1);
        let (mut before, mut after) = (local.and_utc() - day, local.and_utc() + day);
        while (after - before).num_seconds() > 1 {
            let middle = before + chrono::TimeDelta::seconds((after - before).num_seconds() / 2);
            if middle.with_timezone(&self.zone).naive_local() > local {
                after = middle;
            } else {
                before = middle;
            }
        }
        after
    }

    /// The first period due strictly after `after`.
    fn next(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.zone).naive_local();
        // From the second `after` falls in: a period due within it is not after it.
        let local = local.with_nanosecond(0).unwrap_or(local);
        self.local_times_after(local).map(|l| self.instant(l)).find(|due| *due > after)
    }

    /// The last period due at or before `now`.
    fn last(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = now.with_timezone(&self.zone).naive_local();
        let local = local.with_nanosecond(0).unwrap_or(local) + chrono::TimeDelta::seconds(1);
        let mut last = self.cron.after(&local.and_utc()).next_back().map(|l| self.instant(l.naive_utc()));
        // In a repeated hour's second pass, later local times were due in its first.
        for due in self.local_times_after(local - chrono::TimeDelta::seconds(1)).map(|l| self.instant(l)) {
            if due > now {
                break;
            }
            last = Some(due);
        }
        last.filter(|due| *due <= now)
    }
}

async fn run_one<Q: Enqueue>(queue: &Q, entry: &Entry, clock: Clock, counters: &Counters) {
    let periods = Periods { cron: &entry.cron, zone: entry.zone };
    let now = clock.now();
    if entry.missed == Missed::CatchUpLast
        && let Some(due) = periods.last(now)
    {
        enqueue(queue, entry, &periods, clock, counters, due).await;
    }
    let mut after = now;
    loop {
        let Some(due) = periods.next(after) else {
            info!(kind = entry.kind, "the schedule has no more periods");
            return;
        };
        clock.sleep_until(due).await;
        enqueue(queue, entry, &periods, clock, counters, due).await;
        after = due;
    }
}

/// Enqueues the run of the period due at `due`, retrying temporary failures with backoff until
/// it is enqueued or the next period begins.
async fn enqueue<Q: Enqueue>(
    queue: &Q,
    entry: &Entry,
    periods: &Periods<'_>,
    clock: Clock,
    counters: &Counters,
    due: DateTime<Utc>,
) {
    let kind = entry.kind;
    let job = match (entry.make)(due.with_timezone(&entry.zone)) {
        Ok(job) => job,
        Err(e) => {
            counters.add(kind, Outcome::Failed);
            return warn!(kind, error = %e, "the scheduled job could not be built");
        }
    };
    let key = job.key.clone();
    // The last period of a schedule has no next one: it gets a day.
    let deadline = periods.next(due).unwrap_or(due + chrono::TimeDelta::days(1));
    let mut waits = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build();
    // One try always, even for a scheduler that woke late; a try under way is never cut short
    // (it may land); no new one starts once the next period has begun.
    let mut outcome = queue.enqueue(job.clone()).await;
    while let Err(e) = &outcome
        && e.is_temporary()
    {
        let wait = waits.next().unwrap_or(Duration::from_secs(30));
        if clock.now() + wait >= deadline {
            counters.add(kind, Outcome::Lost);
            return error!(kind, key = %key, error = %e, "scheduled run lost: its enqueue failed until the next period");
        }
        counters.add(kind, Outcome::Retried);
        warn!(kind, key = %key, error = %e, ?wait, "scheduled run not enqueued yet, trying again");
        tokio::time::sleep(wait).await;
        outcome = queue.enqueue(job.clone()).await;
    }
    match outcome {
        Ok(Enqueued::Created(_)) => {
            counters.add(kind, Outcome::Enqueued);
            info!(kind, key = %key, "scheduled run enqueued");
        }
        Ok(Enqueued::Duplicate { .. }) => {
            counters.add(kind, Outcome::Duplicate);
            info!(kind, key = %key, "scheduled run already enqueued (by another scheduler, or by an earlier try)");
        }
        Ok(Enqueued::Failed { .. }) => {
            counters.add(kind, Outcome::Duplicate);
            warn!(kind, key = %key, "scheduled run not enqueued: its key ran and failed for good, and its failure record is kept");
        }
        Err(e) => {
            counters.add(kind, Outcome::Failed);
            error!(kind, key = %key, error = %e, "scheduled run not enqueued: the failure is permanent");
        }
    }
}
