//! The scheduler on a controlled clock (tokio's, paused, so that days pass in an instant), over a
//! real in-memory queue behind a wrapper that fails enqueues as told: a temporary failure is
//! retried within its period, a period that cannot be enqueued before the next begins is counted
//! lost, a permanent failure is not retried; and the daylight-saving transitions of
//! America/New_York, a skipped local hour and a repeated one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{Backend, Capabilities, Claim, Kinds};
use redrive_core::{Enqueue, Enqueued, Error, ErrorKind, Job, KeyBuilder, MemoryBackend, NewJob, Result};
use redrive_schedule::{Clock, Missed, ScheduleStats, Scheduler};
use serde::{Deserialize, Serialize};

/// The nightly rollup of one ledger.
#[derive(Serialize, Deserialize)]
struct Rollup {
    ledger: u32,
}

impl Job for Rollup {
    const KIND: &'static str = "rollup";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("ledger", self.ledger)
    }
}

type Failure = Arc<dyn Fn(u32) -> Option<Error> + Send + Sync>;

/// A memory queue whose enqueue number `n` (from 0) fails with `fail(n)`, if that is an error.
#[derive(Clone)]
struct Flaky {
    inner: MemoryBackend,
    tries: Arc<AtomicU32>,
    fail: Failure,
}

impl Flaky {
    fn new(fail: impl Fn(u32) -> Option<Error> + Send + Sync + 'static) -> Self {
        Self { inner: MemoryBackend::new(), tries: Arc::default(), fail: Arc::new(fail) }
    }

    fn tries(&self) -> u32 {
        self.tries.load(Ordering::Relaxed)
    }

    /// The periods of the jobs enqueued, in order.
    async fn periods(&self) -> Vec<String> {
        let claimed = self.inner.claim(&Kinds::Any, 1000, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        let mut periods: Vec<String> = claimed
            .iter()
            .map(|c| c.job.key.to_string())
            .map(|key| key.rsplit_once("period=").map(|(_, p)| p.to_owned()).unwrap_or(key))
            .collect();
        periods.sort();
        periods
    }
}

impl Backend for Flaky {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

impl Enqueue for Flaky {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        if let Some(e) = (self.fail)(self.tries.fetch_add(1, Ordering::Relaxed)) {
            return Err(e);
        }
        self.inner.enqueue(job).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let mut done = Vec::new();
        for job in jobs {
            done.push(self.enqueue(job).await?);
        }
        Ok(done)
    }
}

fn at(text: &str) -> DateTime<Utc> {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Runs `cron` in `zone` on `queue` from `start` for `hours` of the controlled clock.
async fn run(queue: &Flaky, cron: &str, zone: chrono_tz::Tz, start: &str, span: Duration) -> ScheduleStats {
    let scheduler = Scheduler::new(queue.clone()).with_clock(Clock::starting_at(at(start)));
    let scheduler = scheduler.every(cron, zone, Missed::Skip, |_| Rollup { ledger: 7 }).unwrap();
    scheduler.run_until(tokio::time::sleep(span)).await
}

const EVERY_SECOND: &str = "* * * * * *";
const START: &str = "2026-01-01T00:00:00.5Z";

#[tokio::test(start_paused = true)]
async fn a_temporary_enqueue_failure_is_retried_within_its_period() {
    // The first period's enqueue fails twice: a connection reset, a failover.
    let queue = Flaky::new(|n| (n < 2).then(|| Error::temporary("connection reset")));
    let stats = run(&queue, EVERY_SECOND, chrono_tz::UTC, START, Duration::from_secs(3)).await;
    assert_eq!(
        queue.periods().await,
        ["20260101T000001Z", "20260101T000002Z", "20260101T000003Z"],
        "every period enqueued, the first after its retries"
    );
    assert_eq!((stats.enqueued, stats.retries, stats.lost, stats.failed), (3, 2, 0, 0), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_period_still_failing_when_the_next_begins_is_counted_lost() {
    // The queue is down for 1.7 s: the whole of the first period and the start of the second.
    let start = tokio::time::Instant::now();
    let queue = Flaky::new(move |_| {
        (start.elapsed() < Duration::from_millis(1700)).then(|| Error::temporary("the database is restarting"))
    });
    let stats = run(&queue, EVERY_SECOND, chrono_tz::UTC, START, Duration::from_secs(3)).await;
    assert_eq!(queue.periods().await, ["20260101T000002Z", "20260101T000003Z"], "the second caught up in its period");
    assert_eq!((stats.enqueued, stats.lost, stats.failed), (2, 1, 0), "{stats:?}");
    assert!(stats.retries >= 3, "retried while it was down: {stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_enqueue_failure_is_counted_and_not_retried() {
    let queue = Flaky::new(|n| (n == 0).then(|| Error::new(ErrorKind::PayloadTooLarge, "the report is too large")));
    let stats = run(&queue, EVERY_SECOND, chrono_tz::UTC, START, Duration::from_secs(3)).await;
    assert_eq!(queue.periods().await, ["20260101T000002Z", "20260101T000003Z"]);
    assert_eq!(queue.tries(), 3, "one try per period: the permanent failure was not retried");
    assert_eq!((stats.enqueued, stats.retries, stats.lost, stats.failed), (2, 0, 0, 1), "{stats:?}");
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const NEW_YORK: chrono_tz::Tz = chrono_tz::America::New_York;

#[tokio::test(start_paused = true)]
async fn a_daily_run_in_the_hour_spring_forward_skips_runs_once_just_after_it() {
    // 2026-03-08: New York's clocks go from 02:00 EST to 03:00 EDT; 02:30 does not exist that day.
    let queue = Flaky::new(|_| None);
    run(&queue, "0 30 2 * * *", NEW_YORK, "2026-03-07T12:00:00Z", 3 * DAY).await;
    assert_eq!(
        queue.periods().await,
        [
            "20260308T070000Z", // 03:00 EDT, the first local time after the gap
            "20260309T063000Z", // 02:30 EDT
            "20260310T063000Z",
        ],
        "once a day, the skipped day included"
    );
}

#[tokio::test(start_paused = true)]
async fn a_daily_run_in_the_hour_fall_back_repeats_runs_once_at_its_first_occurrence() {
    // 2026-11-01: New York's clocks go from 02:00 EDT back to 01:00 EST; 01:30 happens twice.
    let queue = Flaky::new(|_| None);
    run(&queue, "0 30 1 * * *", NEW_YORK, "2026-10-31T12:00:00Z", 3 * DAY).await;
    assert_eq!(
        queue.periods().await,
        [
            "20261101T053000Z", // 01:30 EDT; not again at 01:30 EST (06:30Z)
            "20261102T063000Z", // 01:30 EST
            "20261103T063000Z",
        ],
        "once a day, the repeated hour included"
    );
}

#[tokio::test(start_paused = true)]
async fn half_hourly_runs_across_both_transitions_never_double_a_period() {
    // Spring forward: 01:00 and 01:30 EST, then 02:00 and 02:30 (which do not exist) and 03:00
    // EDT are one run at the gap's end, then 03:30 EDT: every 30 minutes of real time.
    let queue = Flaky::new(|_| None);
    run(&queue, "0 0,30 * * * *", NEW_YORK, "2026-03-08T05:50:00Z", Duration::from_secs(2 * 60 * 60 + 15 * 60)).await;
    assert_eq!(
        queue.periods().await,
        ["20260308T060000Z", "20260308T063000Z", "20260308T070000Z", "20260308T073000Z", "20260308T080000Z"]
    );

    // Fall back: each local time once, so 01:00 and 01:30 EST (06:00Z, 06:30Z) do not run again.
    let queue = Flaky::new(|_| None);
    run(&queue, "0 0,30 * * * *", NEW_YORK, "2026-11-01T04:50:00Z", Duration::from_secs(3 * 60 * 60 + 15 * 60)).await;
    assert_eq!(
        queue.periods().await,
        ["20261101T050000Z", "20261101T053000Z", "20261101T070000Z", "20261101T073000Z", "20261101T080000Z"]
    );
}
