//! What a job's run has been through, kept in the run's memoized steps.
//!
//! A call carries `ctx.attempt`, which counts Inngest's own calls again since the run's last
//! step and starts over at 0 after each, and nothing of the errors before. So each retry,
//! deferral or hand-back answers first with a **mark**, a `StepRun` whose data is what the job
//! has spent (attempts, the error, the wait), and then, called again at once, with the **wait**, a
//! `Sleep`. Inngest sends every memoized step back on each call: the marks are the error history,
//! and the job's attempt is the last mark's spent attempts, plus Inngest's calls since, plus one.
//! Step ids are `redrive-<n>-mark` and `redrive-<n>-wait`, `n` the steps before it.
//!
//! Inngest allows a run 1,000 steps. A call of a run near that **continues it as a new run**
//! instead of being parked: the job's event is sent again, its data carrying what the marks held
//! ([`CARRIED`]), and the old run completes. The new run starts from the carried progress.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::AttemptError;
use redrive_core::kit::broker::HISTORY;
use serde_json::{Map, Value, json};

/// The field of a continued run's event data that carries the run before it: spent attempts,
/// errors, calls unclaimed, the wait.
pub(crate) const CARRIED: &str = "redrive_carried";

/// A call's event data as the job's body (without what a continued run carries), and what it
/// carries.
pub(crate) fn split_carried(data: &Value) -> (String, Option<Value>) {
    // Only a continued run's data is copied to take the field out: every call comes here.
    let Some(carried) = data.get(CARRIED) else {
        return (serde_json::to_string(data).unwrap_or_default(), None);
    };
    let mut body = data.clone();
    body.as_object_mut().map(|o| o.remove(CARRIED));
    (serde_json::to_string(&body).unwrap_or_default(), Some(carried.clone()))
}

/// The job's id: a continued run's carries its first event's; otherwise the event's own.
pub(crate) fn job_id<'a>(event: &'a Value, carried: Option<&'a Value>) -> Option<&'a str> {
    carried.and_then(|c| c.get("job")).and_then(Value::as_str).or(event["id"].as_str())
}

/// What a run continued after `mark` carries: the job's id (its first event's), the spent
/// attempts, the errors so far (`errors`, then the mark's), the calls unclaimed, the wait still
/// to sleep.
pub(crate) fn carry(job: &str, errors: &[AttemptError], mark: &Mark) -> Value {
    let mut errors: Vec<&AttemptError> = errors.iter().chain(mark.error.as_ref()).collect();
    // The first and the latest, as a record keeps them: the event stays within its room.
    if errors.len() > HISTORY {
        errors.drain(1..errors.len() - (HISTORY - 1));
    }
    json!({
        "job": job,
        "spent": mark.spent,
        "errors": errors,
        "unclaimed": mark.unclaimed,
        "wait_ms": mark.wait.as_millis() as u64,
    })
}

/// What one mark records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mark {
    /// Attempts the job has spent, this one's included if it failed.
    pub(crate) spent: u32,
    /// The failed attempt's error (a retry); none for a deferral or a hand-back.
    pub(crate) error: Option<AttemptError>,
    /// How long to wait before the next call.
    pub(crate) wait: Duration,
    /// Calls handed back unclaimed in a row.
    pub(crate) unclaimed: u32,
}

/// The run so far, read from a call's `steps`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Progress {
    /// The steps memoized: the next step's `n`.
    pub(crate) steps: usize,
    /// The last mark's spent attempts.
    pub(crate) spent: u32,
    /// Every failed attempt's error, oldest first.
    pub(crate) errors: Vec<AttemptError>,
    /// The last mark's wait, when its sleep has not run yet.
    pub(crate) pending: Option<Duration>,
    /// Calls handed back unclaimed in a row.
    pub(crate) unclaimed: u32,
}

impl Progress {
    /// Reads `steps`, after what the run before carried (a continued run); steps that are not
    /// this backend's are counted and otherwise left alone.
    pub(crate) fn read(steps: &Map<String, Value>, carried: Option<&Value>) -> Self {
        let mut ours: Vec<(usize, bool, &Value)> = steps
            .iter()
            .filter_map(|(id, value)| {
                let rest = id.strip_prefix("redrive-")?;
                let (n, what) = rest.split_once('-')?;
                Some((n.parse().ok()?, what == "mark", value))
            })
            .collect();
        ours.sort_by_key(|(n, _, _)| *n);
        let mut progress = Self { steps: steps.len(), ..Self::default() };
        if let Some(carried) = carried {
            progress.note(carried);
        }
        for (_, is_mark, value) in ours {
            if !is_mark {
                progress.pending = None;
                continue;
            }
            // A memoized StepRun is `{"data": …}`.
            progress.note(value.get("data").unwrap_or(value));
        }
        progress
    }

    /// Takes in a mark's data, or what a run before carried (its errors, a list).
    fn note(&mut self, data: &Value) {
        self.spent = data.get("spent").and_then(Value::as_u64).unwrap_or(0) as u32;
        self.unclaimed = data.get("unclaimed").and_then(Value::as_u64).unwrap_or(0) as u32;
        let read = |e: &Value| serde_json::from_value::<AttemptError>(e.clone()).ok();
        self.errors.extend(data.get("error").and_then(read));
        self.errors.extend(data.get("errors").and_then(Value::as_array).into_iter().flatten().filter_map(read));
        let wait = Duration::from_millis(data.get("wait_ms").and_then(Value::as_u64).unwrap_or(0));
        self.pending = (!wait.is_zero()).then_some(wait);
    }

    /// The attempt a call is: the spent attempts, Inngest's calls again since the last step
    /// (`ctx.attempt`: each a call that got no answer), and this one.
    pub(crate) fn attempt(&self, ctx_attempt: u32) -> u32 {
        self.spent + ctx_attempt + 1
    }
}

/// The op that records `mark` as step `n`.
pub(crate) fn mark_op(n: usize, mark: &Mark) -> Value {
    json!({
        "id": format!("redrive-{n}-mark"),
        "op": "StepRun",
        "name": "redrive",
        "displayName": if mark.error.is_some() { "redrive: an attempt failed" } else { "redrive: deferred" },
        "data": {
            "spent": mark.spent,
            "error": mark.error,
            "wait_ms": mark.wait.as_millis() as u64,
            "unclaimed": mark.unclaimed,
        },
    })
}

/// The op that sleeps `wait` as step `n`.
pub(crate) fn wait_op(n: usize, wait: Duration) -> Value {
    let duration = duration_text(wait);
    json!({
        "id": format!("redrive-{n}-wait"),
        "op": "Sleep",
        "name": duration,
        "displayName": "redrive: waiting",
        "opts": { "duration": duration },
    })
}

/// A duration as Inngest reads it: whole milliseconds under a second, else whole seconds rounded
/// up (never sooner than asked).
fn duration_text(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis().max(1))
    } else {
        format!("{}s", d.as_secs() + u64::from(d.subsec_nanos() > 0))
    }
}

/// An error for a mark, at `at`.
pub(crate) fn error_at(attempt: u32, error: &str, at: DateTime<Utc>) -> AttemptError {
    let cut = redrive_core::kit::broker::cut(error, redrive_core::kit::broker::HISTORY_ERROR_LEN).to_owned();
    AttemptError { attempt, at, error: cut }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memoized(ops: &[Value]) -> Map<String, Value> {
        ops.iter()
            .map(|op| {
                let value = if op["op"] == "StepRun" { json!({ "data": op["data"] }) } else { Value::Null };
                (op["id"].as_str().unwrap().to_owned(), value)
            })
            .collect()
    }

    #[test]
    fn attempts_and_errors_come_back_from_the_marks() {
        assert_eq!(Progress::read(&Map::new(), None).attempt(0), 1);
        let at = Utc::now();
        let failed =
            Mark { spent: 1, error: Some(error_at(1, "boom", at)), wait: Duration::from_millis(250), unclaimed: 0 };
        let mut steps = memoized(&[mark_op(0, &failed)]);
        let progress = Progress::read(&steps, None);
        assert_eq!(progress.pending, Some(Duration::from_millis(250)), "the mark's wait is next");
        steps.extend(memoized(&[wait_op(1, Duration::from_millis(250))]));
        let progress = Progress::read(&steps, None);
        assert_eq!((progress.pending, progress.steps, progress.attempt(0)), (None, 2, 2));
        // A crash after it: Inngest called again once, and the attempt counts it.
        assert_eq!(progress.attempt(1), 3);
        let deferred = Mark { spent: 2, error: None, wait: Duration::from_secs(3), unclaimed: 0 };
        steps.extend(memoized(&[mark_op(2, &deferred), wait_op(3, Duration::from_secs(3))]));
        let progress = Progress::read(&steps, None);
        assert_eq!(progress.attempt(0), 3, "a deferral spends nothing");
        assert_eq!(progress.errors.iter().map(|e| (e.attempt, e.error.as_str())).collect::<Vec<_>>(), [(1, "boom")]);
        assert_eq!(wait_op(0, Duration::from_millis(1500))["opts"]["duration"], "2s");
    }

    #[test]
    fn a_continued_run_starts_where_the_run_before_stopped() {
        let at = Utc::now();
        let before = [error_at(1, "boom", at)];
        let mark = Mark { spent: 2, error: Some(error_at(2, "bang", at)), wait: Duration::from_secs(2), unclaimed: 0 };
        let carried = carry("evt-1", &before, &mark);
        let started = Progress::read(&Map::new(), Some(&carried));
        assert_eq!(started.pending, Some(Duration::from_secs(2)), "the wait is slept first");
        assert_eq!(started.errors.iter().map(|e| e.error.as_str()).collect::<Vec<_>>(), ["boom", "bang"]);
        let slept = Progress::read(&memoized(&[wait_op(0, Duration::from_secs(2))]), Some(&carried));
        assert_eq!((slept.pending, slept.attempt(0), slept.steps), (None, 3, 1));
        let data = json!({ "kind": "charge", CARRIED: carried });
        let (body, found) = split_carried(&data);
        assert_eq!((body.as_str(), found.is_some()), (r#"{"kind":"charge"}"#, true));
    }
}
