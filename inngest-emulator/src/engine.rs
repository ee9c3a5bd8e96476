//! The emulator's state and its executor: events in, runs out, each run's calls signed, retried
//! and ended, a failed run announced as `inngest/function.failed`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::sign;
use crate::{Call, Function, Run, RunStatus};

/// Inngest's default retry table (15 s up to 2 h), before the time scale.
const BACKOFF_SECS: [u64; 10] = [15, 30, 60, 120, 300, 600, 1200, 2400, 3600, 7200];

/// The failed-run event's name.
pub(crate) const FAILED: &str = "inngest/function.failed";

pub(crate) struct Config {
    pub(crate) event_key: String,
    pub(crate) signing_key: String,
    pub(crate) signing_key_fallback: Option<String>,
    pub(crate) dedupe_window: Duration,
    pub(crate) time_scale: f64,
    pub(crate) max_steps: usize,
}

impl Config {
    pub(crate) fn keys(&self) -> Vec<&str> {
        std::iter::once(self.signing_key.as_str()).chain(self.signing_key_fallback.as_deref()).collect()
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) functions: Vec<Function>,
    pub(crate) runs: Vec<Run>,
    pub(crate) calls: Vec<Call>,
    /// (function id, the event's own id) → when its run was made: the id's dedupe.
    pub(crate) seen: HashMap<(String, String), Instant>,
    /// Events as stored, with the id the API answered for each, oldest first.
    pub(crate) events: Vec<(String, Value)>,
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Notify,
    pub(crate) http: reqwest::Client,
    pub(crate) event_requests: AtomicU64,
    pub(crate) next_id: AtomicU64,
    /// Each function's concurrency limit, as calls in flight.
    pub(crate) limits: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new id with a prefix, unique within this emulator.
    pub(crate) fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let random: u32 = rand::random();
        format!("{prefix}_{n:08}{random:08x}")
    }

    /// Takes events as the event API received them: each gets an id, and starts a run of every
    /// function it triggers, unless that function already ran for the event's own `id` within
    /// the dedupe window. Returns the ids, in order.
    pub(crate) fn ingest(self: &Arc<Self>, events: Vec<Value>) -> Vec<String> {
        let mut ids = Vec::with_capacity(events.len());
        for mut event in events {
            let id = self.id("01evt");
            let own_id = event.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
            if own_id.is_none() {
                event["id"] = Value::String(id.clone());
            }
            if event.get("ts").and_then(Value::as_i64).unwrap_or(0) == 0 {
                event["ts"] = json!(Utc::now().timestamp_millis());
            }
            if !event.get("data").is_some_and(Value::is_object) {
                event["data"] = json!({});
            }
            if !event.get("user").is_some_and(Value::is_object) {
                event["user"] = json!({});
            }
            let triggered: Vec<Function> = {
                let mut state = self.lock();
                state.events.push((id.clone(), event.clone()));
                let now = Instant::now();
                let window = self.config.dedupe_window;
                let matching: Vec<Function> =
                    state.functions.iter().filter(|f| f.triggered_by(&event)).cloned().collect();
                let mut fresh = Vec::new();
                for function in matching {
                    if let Some(own) = &own_id {
                        let key = (function.id.clone(), own.clone());
                        // Kept for the emulator's life, as its events and runs are: only the age counts.
                        if state.seen.get(&key).is_some_and(|at| now.duration_since(*at) < window) {
                            debug!(function = %function.id, event = %id, "an event id seen within the window: no new run");
                            continue;
                        }
                        state.seen.insert(key, now);
                    }
                    fresh.push(function);
                }
                fresh
            };
            for function in triggered {
                self.start_run(function, id.clone(), event.clone(), None);
            }
            ids.push(id);
        }
        self.changed.notify_waiters();
        ids
    }

    /// Starts a run of `function` for `event` (stored under `event_id`); `rerun_of` names the run
    /// it reruns.
    pub(crate) fn start_run(
        self: &Arc<Self>,
        function: Function,
        event_id: String,
        event: Value,
        rerun_of: Option<String>,
    ) -> String {
        let run_id = self.id("01run");
        let run = Run {
            id: run_id.clone(),
            function_id: function.id.clone(),
            event_id,
            event: event.clone(),
            status: RunStatus::Running,
            output: None,
            error: None,
            started_at: Utc::now(),
            ended_at: None,
            original_run_id: rerun_of,
        };
        self.lock().runs.push(run);
        info!(run = %run_id, function = %function.id, "run started");
        let shared = Arc::clone(self);
        let id = run_id.clone();
        tokio::spawn(async move { shared.execute(function, id, event).await });
        self.changed.notify_waiters();
        run_id
    }

    fn status(&self, run_id: &str) -> Option<RunStatus> {
        self.lock().runs.iter().find(|r| r.id == run_id).map(|r| r.status)
    }

    fn end(&self, run_id: &str, status: RunStatus, output: Option<Value>, error: Option<Value>) -> Option<Run> {
        let mut state = self.lock();
        let run = state.runs.iter_mut().find(|r| r.id == run_id)?;
        if run.status != RunStatus::Running {
            return None;
        }
        run.status = status;
        run.output = output;
        run.error = error;
        run.ended_at = Some(Utc::now());
        let run = run.clone();
        drop(state);
        self.changed.notify_waiters();
        Some(run)
    }

    /// Calls the function until its run ends: steps memoized and called again, errors retried
    /// with backoff up to the function's attempts, sleeps waited out without spending one.
    async fn execute(self: Arc<Self>, function: Function, run_id: String, event: Value) {
        let max_attempts = function.retries + 1;
        let mut steps = serde_json::Map::new();
        let mut stack: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        let mut step_id = "step".to_owned();
        let mut version = -1i64;
        loop {
            if self.status(&run_id) != Some(RunStatus::Running) {
                return; // cancelled
            }
            let body = json!({
                "event": event,
                "events": [event],
                "steps": steps,
                "ctx": {
                    "run_id": run_id,
                    "attempt": attempt,
                    "max_attempts": max_attempts,
                    "disable_immediate_execution": false,
                    "use_api": false,
                    "stack": { "stack": stack, "current": stack.len() },
                },
                "use_api": false,
                "version": version,
            });
            let outcome = self.call(&function, &run_id, &step_id, attempt, &body).await;
            if let Some(v) = outcome.version {
                version = v;
            }
            step_id = "step".to_owned();
            match outcome.verdict {
                Verdict::Done(output) => {
                    self.end(&run_id, RunStatus::Completed, Some(output), None);
                    info!(run = %run_id, function = %function.id, "run completed");
                    return;
                }
                Verdict::Ops(ops) if steps.len() + ops.len() > self.config.max_steps => {
                    let limit = self.config.max_steps;
                    let error =
                        json!({ "name": "Error", "message": format!("the run reached its limit of {limit} steps") });
                    self.fail(&function, &run_id, &event, error);
                    return;
                }
                Verdict::Ops(ops) => match self.step(&ops, &mut steps, &mut stack, &mut step_id).await {
                    StepOutcome::Next => attempt = 0,
                    StepOutcome::Retry(error, after) => {
                        if !self.retry(&function, &run_id, &event, &mut attempt, max_attempts, error, after).await {
                            return;
                        }
                    }
                    StepOutcome::Unsupported(op) => {
                        let error =
                            json!({ "name": "Error", "message": format!("the emulator does not run the {op} op") });
                        self.fail(&function, &run_id, &event, error);
                        return;
                    }
                },
                Verdict::Error { error, retry: false, .. } => {
                    self.fail(&function, &run_id, &event, error);
                    return;
                }
                Verdict::Error { error, retry: true, after } => {
                    if !self.retry(&function, &run_id, &event, &mut attempt, max_attempts, error, after).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits before the next attempt, or fails the run at its last; false if the run ended.
    #[allow(clippy::too_many_arguments)]
    async fn retry(
        self: &Arc<Self>,
        function: &Function,
        run_id: &str,
        event: &Value,
        attempt: &mut u32,
        max_attempts: u32,
        error: Value,
        after: Option<Duration>,
    ) -> bool {
        if *attempt + 1 >= max_attempts {
            self.fail(function, run_id, event, error);
            return false;
        }
        let delay = after.unwrap_or_else(|| self.backoff(*attempt));
        debug!(run = %run_id, attempt = *attempt, delay_ms = delay.as_millis() as u64, "retrying");
        tokio::time::sleep(delay).await;
        *attempt += 1;
        true
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let base = BACKOFF_SECS[(attempt as usize).min(BACKOFF_SECS.len() - 1)] as f64;
        let jitter = rand::random::<f64>() * 30.0 * 0.1;
        Duration::from_secs_f64(((base + jitter) * self.config.time_scale).max(0.0))
    }

    /// Ends the run failed and sends `inngest/function.failed` for it.
    fn fail(self: &Arc<Self>, function: &Function, run_id: &str, event: &Value, error: Value) {
        if self.end(run_id, RunStatus::Failed, None, Some(error.clone())).is_none() {
            return;
        }
        warn!(run = %run_id, function = %function.id, "run failed");
        let failed = json!({
            "name": FAILED,
            "id": format!("failed-{run_id}"),
            "data": {
                "function_id": function.id,
                "run_id": run_id,
                "event": event,
                "events": [event],
                "error": error,
            },
        });
        self.ingest(vec![failed]);
    }

    /// Carries out the ops of a 206 answer.
    async fn step(
        &self,
        ops: &[Value],
        steps: &mut serde_json::Map<String, Value>,
        stack: &mut Vec<String>,
        step_id: &mut String,
    ) -> StepOutcome {
        for op in ops {
            let id = op.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
            let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
            match name {
                "StepRun" | "Step" => {
                    steps.insert(id.clone(), json!({ "data": op.get("data").cloned().unwrap_or(Value::Null) }));
                    stack.push(id);
                }
                "StepFailed" => {
                    steps.insert(id.clone(), json!({ "error": op.get("error").cloned().unwrap_or(Value::Null) }));
                    stack.push(id);
                }
                "StepError" => {
                    let error = op.get("error").cloned().unwrap_or(Value::Null);
                    return StepOutcome::Retry(error, None);
                }
                "StepPlanned" => {
                    *step_id = id;
                    return StepOutcome::Next;
                }
                "Sleep" => {
                    let wait = sleep_of(op).unwrap_or_default();
                    tokio::time::sleep(wait).await;
                    steps.insert(id.clone(), Value::Null);
                    stack.push(id);
                }
                other => return StepOutcome::Unsupported(other.to_owned()),
            }
        }
        StepOutcome::Next
    }

    /// A place among the function's calls in flight, where it has a concurrency limit.
    async fn in_flight(&self, function: &Function) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let limit = function.concurrency?;
        let semaphore = {
            let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(
                limits.entry(function.id.clone()).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(limit))),
            )
        };
        semaphore.acquire_owned().await.ok()
    }

    /// One signed call of the function, within its concurrency limit; what its answer says.
    async fn call(&self, function: &Function, run_id: &str, step_id: &str, attempt: u32, body: &Value) -> Outcome {
        let _in_flight = self.in_flight(function).await;
        let bytes = serde_jcs::to_vec(body).expect("a JSON value serializes");
        let t = Utc::now().timestamp();
        let url = with_step(&function.url, step_id);
        let sent = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header("x-inngest-signature", sign::signature(&self.config.signing_key, &bytes, t))
            .header("x-run-id", run_id)
            .body(bytes)
            .send()
            .await;
        let outcome = match sent {
            Ok(response) => self.read(response).await,
            Err(e) => Outcome::error(json!({ "name": "Error", "message": format!("no response: {e}") }), true, None),
        };
        let status = outcome.status;
        self.lock().calls.push(Call { run_id: run_id.to_owned(), function_id: function.id.clone(), attempt, status });
        self.changed.notify_waiters();
        outcome
    }

    async fn read(&self, response: reqwest::Response) -> Outcome {
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let no_retry = header("x-inngest-no-retry");
        let retry_after = header("retry-after").and_then(|v| retry_after(&v));
        let version = header("x-inngest-req-version").and_then(|v| v.parse().ok());
        let is_sdk = header("x-inngest-sdk").is_some();
        let signed = header("x-inngest-signature");
        let body = response.bytes().await.unwrap_or_default();
        // A response signature, where the SDK sends one, must be the emulator's key over the
        // bytes sent: an answer from something else is not the function's.
        if let Some(signed) = signed
            && sign::verify(&self.config.keys(), &signed, &body, Utc::now().timestamp()).is_err()
        {
            let error = json!({ "name": "Error", "message": "the response's signature does not verify" });
            return Outcome { status: Some(status), version, ..Outcome::error(error, true, None) };
        }
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut outcome = match status {
            200 if is_sdk => Outcome::done(value),
            206 if is_sdk => match value {
                Value::Array(ops) => Outcome { verdict: Verdict::Ops(ops), status: None, version: None },
                other => Outcome::error(
                    json!({ "name": "Error", "message": "a 206 without ops", "body": other }),
                    true,
                    None,
                ),
            },
            200..=299 => {
                Outcome::error(json!({ "name": "Error", "message": "not an Inngest SDK's answer" }), true, None)
            }
            _ => {
                let retry = match no_retry.as_deref() {
                    Some("true") => false,
                    Some("false") => true,
                    _ => status >= 500,
                };
                Outcome::error(value, retry, retry_after)
            }
        };
        outcome.status = Some(status);
        outcome.version = version;
        outcome
    }
}

enum Verdict {
    Done(Value),
    Ops(Vec<Value>),
    Error { error: Value, retry: bool, after: Option<Duration> },
}

struct Outcome {
    verdict: Verdict,
    status: Option<u16>,
    version: Option<i64>,
}

impl Outcome {
    fn done(output: Value) -> Self {
        Self { verdict: Verdict::Done(output), status: None, version: None }
    }

    fn error(error: Value, retry: bool, after: Option<Duration>) -> Self {
        Self { verdict: Verdict::Error { error, retry, after }, status: None, version: None }
    }
}

enum StepOutcome {
    Next,
    Retry(Value, Option<Duration>),
    Unsupported(String),
}

/// The function's URL with `stepId` set.
fn with_step(url: &str, step_id: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            let kept: Vec<(String, String)> = parsed
                .query_pairs()
                .filter(|(k, _)| k != "stepId")
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            parsed.query_pairs_mut().clear().extend_pairs(kept).append_pair("stepId", step_id);
            parsed.into()
        }
        Err(_) => url.to_owned(),
    }
}

/// `Retry-After`: whole seconds, an RFC 3339 time, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    if let Ok(secs) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at: DateTime<Utc> = DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| httpdate::parse_http_date(value.trim()).ok().map(DateTime::<Utc>::from))?;
    Some((at - Utc::now()).to_std().unwrap_or_default())
}

/// How long a `Sleep` op waits: `opts.duration`, else its `name`, a duration ("30s", "1m") or a
/// time to sleep until.
fn sleep_of(op: &Value) -> Option<Duration> {
    let text = op.pointer("/opts/duration").or_else(|| op.get("name")).and_then(Value::as_str)?;
    if let Ok(d) = humantime::parse_duration(text) {
        return Some(d);
    }
    let until = DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc);
    Some((until - Utc::now()).to_std().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_and_sleeps_read_every_form_the_sdks_send() {
        assert_eq!(retry_after("7"), Some(Duration::from_secs(7)));
        let soon = (Utc::now() + chrono::Duration::seconds(60)).to_rfc3339();
        assert!(retry_after(&soon).is_some_and(|d| d > Duration::from_secs(50)));
        assert_eq!(sleep_of(&json!({ "op": "Sleep", "name": "2s" })), Some(Duration::from_secs(2)));
        assert_eq!(
            sleep_of(&json!({ "op": "Sleep", "opts": { "duration": "500ms" } })),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            with_step("http://h/api/inngest?fnId=a-b&stepId=step", "abc"),
            "http://h/api/inngest?fnId=a-b&stepId=abc"
        );
    }
}
