//! The attempt policy: what happens after an attempt, as a pure function of the attempt, the
//! cap, the job's age and the handler's outcome; and the backoff between attempts.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use serde_json::Value;

use crate::job::{JobError, Retrying};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The effect happened; the value is stored in the ledger as its result.
    Done(Value),
    /// It failed and may succeed later; `after` overrides the backoff.
    Retry {
        /// A delay the handler asked for.
        after: Option<Duration>,
        /// The error.
        error: String,
    },
    /// It failed and retrying cannot help.
    Fail {
        /// The error.
        error: String,
    },
    /// Not now: the handler asked to be tried again after `after` at no attempt's cost (see
    /// [`JobError::not_now`]).
    NotNow {
        /// How long to wait.
        after: Duration,
        /// Why, as the handler said it: logged, and written as an error only where the "not now"
        /// counts as a retry (a job past [`RetryPolicy::max_not_now`]).
        error: String,
    },
}

impl From<JobError> for Outcome {
    /// A failed attempt: retried (after the delay its handler asked for, if any) unless its
    /// handler said retrying cannot help.
    fn from(failed: JobError) -> Self {
        let error = failed.message().to_owned();
        match failed.retrying() {
            Retrying::Never => Self::Fail { error },
            Retrying::Backoff => Self::Retry { after: None, error },
            Retrying::After(delay) => Self::Retry { after: Some(delay), error },
            Retrying::NotNow(after) => Self::NotNow { after, error },
        }
    }
}

/// What the worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Mark the job complete.
    Complete,
    /// Make it ready again after this delay.
    RetryIn(Duration),
    /// Put it back for this delay at no attempt's cost: no error written, never a record.
    DeferFor(Duration),
    /// Write the failure record and alert.
    DeadLetter,
}

/// Exponential backoff with jitter, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay before the second attempt (before jitter).
    pub base: Duration,
    /// The growth factor per attempt.
    pub factor: f32,
    /// The longest delay, jitter included.
    pub max: Duration,
    /// Adds a random share (0 to 100 %) of the delay, so retries of a burst spread out.
    pub jitter: bool,
}

impl Default for Backoff {
    /// 1 s, doubling, at most 5 minutes, with jitter.
    fn default() -> Self {
        Self { base: Duration::from_secs(1), factor: 2.0, max: Duration::from_secs(300), jitter: true }
    }
}

impl Backoff {
    /// No delay at all: for tests and for queues that pace retries themselves.
    pub const NONE: Self = Self { base: Duration::ZERO, factor: 1.0, max: Duration::ZERO, jitter: false };

    /// The delay after failed attempt number `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_factor(self.factor)
            .with_max_delay(self.max)
            .without_max_times();
        if self.jitter {
            builder = builder.with_jitter();
        }
        let nth = attempt.max(1) as usize - 1;
        builder.build().nth(nth).unwrap_or(self.max).min(self.max)
    }
}

/// How long a job may be put back "not now" before a "not now" counts as an attempt: 24 hours.
pub const DEFAULT_MAX_NOT_NOW: Duration = Duration::from_secs(24 * 60 * 60);

/// Decides what follows an attempt. Pure, apart from the jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// The delays between attempts.
    pub backoff: Backoff,
    /// A job may be put back "not now" at no attempt's cost only while it is younger than this
    /// (its age counted from when it was first enqueued, so nothing more is stored); an older
    /// job's "not now" is a retry after the delay asked for, so it cannot wait for ever unseen.
    pub max_not_now: Duration,
}

impl Default for RetryPolicy {
    /// The default backoff; "not now" at no cost for [`DEFAULT_MAX_NOT_NOW`].
    fn default() -> Self {
        Self { backoff: Backoff::default(), max_not_now: DEFAULT_MAX_NOT_NOW }
    }
}

impl RetryPolicy {
    /// After attempt `attempt` of `cap` of a job enqueued `age` ago ended with `outcome`:
    /// complete, retry, defer, or dead-letter. Attempts are counted at claim, so `attempt >= cap`
    /// means none is left.
    pub fn decide(&self, attempt: u32, cap: u32, age: Duration, outcome: &Outcome) -> Decision {
        match outcome {
            Outcome::Done(_) => Decision::Complete,
            Outcome::Fail { .. } => Decision::DeadLetter,
            // Whatever the attempt: a deferral gives the attempt back.
            Outcome::NotNow { after, .. } if age < self.max_not_now => Decision::DeferFor(*after),
            Outcome::Retry { .. } | Outcome::NotNow { .. } if attempt >= cap => Decision::DeadLetter,
            Outcome::Retry { after: Some(delay), .. } | Outcome::NotNow { after: delay, .. } => {
                Decision::RetryIn(*delay)
            }
            Outcome::Retry { after: None, .. } => Decision::RetryIn(self.backoff.delay(attempt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry() -> Outcome {
        Outcome::Retry { after: None, error: "timeout".into() }
    }

    const YOUNG: Duration = Duration::from_secs(1);

    #[test]
    fn retries_until_the_cap_then_dead_letters() {
        let policy = RetryPolicy { backoff: Backoff::NONE, ..RetryPolicy::default() };
        let decisions: Vec<_> = (1..=5).map(|a| policy.decide(a, 5, YOUNG, &retry())).collect();
        assert_eq!(decisions[..4], [Decision::RetryIn(Duration::ZERO); 4]);
        assert_eq!(decisions[4], Decision::DeadLetter);
        assert_eq!(policy.decide(6, 5, YOUNG, &retry()), Decision::DeadLetter, "past the cap never retries");
    }

    #[test]
    fn permanent_failures_dead_letter_at_once_and_success_completes() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.decide(1, 5, YOUNG, &Outcome::Fail { error: "bad".into() }), Decision::DeadLetter);
        assert_eq!(policy.decide(5, 5, YOUNG, &Outcome::Done(Value::Null)), Decision::Complete);
    }

    #[test]
    fn a_requested_delay_wins_below_the_cap_only() {
        let policy = RetryPolicy::default();
        let asked = Outcome::Retry { after: Some(Duration::from_secs(42)), error: "429".into() };
        assert_eq!(policy.decide(2, 5, YOUNG, &asked), Decision::RetryIn(Duration::from_secs(42)));
        assert_eq!(policy.decide(5, 5, YOUNG, &asked), Decision::DeadLetter);
    }

    #[test]
    fn not_now_costs_no_attempt_until_the_job_is_too_old_then_it_is_a_retry() {
        let policy = RetryPolicy { max_not_now: Duration::from_secs(3600), ..RetryPolicy::default() };
        let later = Outcome::NotNow { after: Duration::from_secs(42), error: "429".into() };
        let table = [
            ("young, first attempt", 1, YOUNG, Decision::DeferFor(Duration::from_secs(42))),
            ("young, at the cap: still no record", 5, YOUNG, Decision::DeferFor(Duration::from_secs(42))),
            ("young, past the cap", 9, Duration::from_secs(3599), Decision::DeferFor(Duration::from_secs(42))),
            (
                "too old: a retry after the delay",
                2,
                Duration::from_secs(3600),
                Decision::RetryIn(Duration::from_secs(42)),
            ),
            ("too old, at the cap: the record", 5, Duration::from_secs(7200), Decision::DeadLetter),
        ];
        for (case, attempt, age, expected) in table {
            assert_eq!(policy.decide(attempt, 5, age, &later), expected, "{case}");
        }
        assert_eq!(RetryPolicy::default().max_not_now, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn a_handler_error_is_the_outcome_it_asks_for() {
        assert_eq!(Outcome::from(JobError::permanent("bad")), Outcome::Fail { error: "bad".into() });
        assert_eq!(Outcome::from(JobError::retry("down")), Outcome::Retry { after: None, error: "down".into() });
        let throttled = JobError::retry_after(Duration::from_secs(42), "429");
        assert_eq!(
            Outcome::from(throttled),
            Outcome::Retry { after: Some(Duration::from_secs(42)), error: "429".into() }
        );
        let later = JobError::not_now(Duration::from_secs(60), "maintenance");
        assert_eq!(
            Outcome::from(later),
            Outcome::NotNow { after: Duration::from_secs(60), error: "maintenance".into() }
        );
    }

    #[test]
    fn backoff_grows_exponentially_and_stops_at_max() {
        let plain = Backoff { jitter: false, ..Backoff::default() };
        let delays: Vec<_> = (1..=4).map(|a| plain.delay(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8]);
        assert_eq!(plain.delay(30), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_between_the_delay_and_twice_it_and_under_max() {
        let jittered = Backoff::default();
        let samples: Vec<_> = (0..200).map(|_| jittered.delay(3)).collect();
        assert!(samples.iter().all(|d| *d >= Duration::from_secs(4) && *d <= Duration::from_secs(8)));
        assert!(samples.iter().any(|d| *d != samples[0]), "jitter varies the delay");
        assert!((0..50).all(|_| jittered.delay(40) <= jittered.max));
    }
}
