//! A local emulator of [Inngest](https://www.inngest.com/docs)'s event API and executor, for
//! tests and offline development, written from the SDK specification and the API reference.
//!
//! Events sent to `POST /e/{event key}` start a run of every registered function they trigger;
//! an event's own `id` starts at most one run per function within the dedupe window (24 hours
//! by default). Apps sync with `POST /fn/register` (the SDKs' out-of-band sync, started by
//! [`Emulator::sync`]). Each run calls its function with a signed request
//! (`X-Inngest-Signature`, over the body's canonical JSON), retries errors with Inngest's backoff
//! (scaled by [`EmulatorBuilder::time_scale`]) up to the function's attempts, honours
//! `Retry-After` and `X-Inngest-No-Retry`, runs steps and sleeps (1,000 a run at most, as Inngest), and announces a failed run with
//! an `inngest/function.failed` event. The runs API reads, cancels and reruns runs. The official
//! SDKs (npm `inngest`, PyPI `inngest`) work against it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redrive_inngest_emulator::Error> {
//! use redrive_inngest_emulator::Emulator;
//!
//! let emu = Emulator::builder().time_scale(0.001).start_local().await?;
//! println!("INNGEST_BASE_URL={} INNGEST_SIGNING_KEY={}", emu.url(), emu.signing_key());
//! emu.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! It listens on loopback only and is not a production service: state lives in memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

mod engine;
mod server;
mod sign;

use engine::{Config, Shared, State};

/// What went wrong starting the emulator or talking to an app.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// A function an app registered.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// `<app id>-<function id>`, as the SDKs name it.
    pub id: String,
    /// Its display name.
    pub name: String,
    /// The app that registered it.
    pub app: String,
    /// The events that start it.
    pub triggers: Vec<Trigger>,
    /// The URL its calls go to (`?fnId=…&stepId=step`).
    pub url: String,
    /// Retries after the first attempt (Inngest's default: 4).
    pub retries: u32,
    /// The most calls of it in flight at once (`concurrency`'s limit without a key), if any.
    pub concurrency: Option<usize>,
}

/// An event trigger: its name, and the one expression form the emulator evaluates,
/// `event.data.<field> == '<text>'` (what the SDKs register for failure handlers). A trigger
/// with any other expression never fires, and its registration says so in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    /// The event name.
    pub event: String,
    /// The trigger's expression, if any.
    pub expression: Option<String>,
}

impl Function {
    fn from_config(app: &str, config: &Value) -> Result<Self, String> {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let id = text(config.get("id")).ok_or("a function without an id")?;
        let step = config.pointer("/steps/step").ok_or_else(|| format!("function {id}: no step named step"))?;
        let url = text(step.pointer("/runtime/url")).ok_or_else(|| format!("function {id}: no runtime url"))?;
        let retries = step.pointer("/retries/attempts").and_then(Value::as_u64).unwrap_or(4).min(20) as u32;
        let mut triggers = Vec::new();
        for trigger in config.get("triggers").and_then(Value::as_array).into_iter().flatten() {
            if let Some(event) = text(trigger.get("event")) {
                let expression = text(trigger.get("expression"));
                if expression.as_deref().is_some_and(|e| equality(e).is_none()) {
                    tracing::warn!(function = %id, "a trigger expression the emulator does not evaluate: it never fires");
                }
                triggers.push(Trigger { event, expression });
            } else {
                tracing::warn!(function = %id, "a trigger without an event (a cron?): the emulator does not run it");
            }
        }
        // `concurrency`: a number, or a list of `{limit, key?, scope?}`: the limits without a key
        // are the function's own; the least of them holds.
        let concurrency = match config.get("concurrency") {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::Array(limits)) => limits
                .iter()
                .filter(|l| l.get("key").is_none())
                .filter_map(|l| l.get("limit").and_then(Value::as_u64))
                .min(),
            _ => None,
        }
        .filter(|n| *n > 0)
        .map(|n| n as usize);
        Ok(Self {
            name: text(config.get("name")).unwrap_or_else(|| id.clone()),
            id,
            app: app.to_owned(),
            triggers,
            url,
            retries,
            concurrency,
        })
    }

    fn triggered_by(&self, event: &Value) -> bool {
        let name = event.get("name").and_then(Value::as_str).unwrap_or_default();
        self.triggers.iter().any(|t| {
            t.event == name
                && match &t.expression {
                    None => true,
                    Some(expression) => equality(expression).is_some_and(|(path, want)| {
                        event.pointer(&path).and_then(Value::as_str) == Some(want.as_str())
                    }),
                }
        })
    }
}

/// `event.data.a.b == 'text'` (or "text") as a JSON pointer and the text.
fn equality(expression: &str) -> Option<(String, String)> {
    let (left, right) = expression.split_once("==")?;
    let path = left.trim().strip_prefix("event.")?;
    if path.is_empty() || !path.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
    {
        return None;
    }
    let right = right.trim();
    let text = right
        .strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| right.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
    Some((format!("/{}", path.replace('.', "/")), text.to_owned()))
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Being called, waiting to be retried, or sleeping.
    Running,
    /// The function returned.
    Completed,
    /// Out of attempts, or refused for good: `inngest/function.failed` was sent.
    Failed,
    /// Cancelled through the runs API.
    Cancelled,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
            Self::Cancelled => "Cancelled",
        }
    }
}

/// A run of a function on an event.
#[derive(Debug, Clone)]
pub struct Run {
    /// The run's id.
    pub id: String,
    /// The function it runs.
    pub function_id: String,
    /// The id the event API answered for its event.
    pub event_id: String,
    /// The event as the function receives it.
    pub event: Value,
    /// Where it is.
    pub status: RunStatus,
    /// What the function returned.
    pub output: Option<Value>,
    /// The last error, for a failed run.
    pub error: Option<Value>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// The run it reruns, for a rerun.
    pub original_run_id: Option<String>,
}

impl Run {
    fn to_json(&self) -> Value {
        json!({
            "run_id": self.id,
            "function_id": self.function_id,
            "event_id": self.event_id,
            "status": self.status.as_str(),
            "run_started_at": self.started_at.to_rfc3339(),
            "ended_at": self.ended_at.map(|t| t.to_rfc3339()),
            "output": self.output,
            "original_run_id": self.original_run_id,
        })
    }
}

/// One call the emulator made to a function (for test inspection and counting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The run it belongs to.
    pub run_id: String,
    /// The function called.
    pub function_id: String,
    /// The attempt sent (from 0).
    pub attempt: u32,
    /// The function's status code; `None` when no response came.
    pub status: Option<u16>,
}

/// Configures an [`Emulator`].
#[derive(Debug)]
pub struct EmulatorBuilder {
    event_key: String,
    signing_key: Option<String>,
    signing_key_fallback: Option<String>,
    dedupe_window: Duration,
    time_scale: f64,
    max_steps: usize,
}

impl EmulatorBuilder {
    /// The event key the event API accepts (default `test-event-key`).
    pub fn event_key(mut self, key: impl Into<String>) -> Self {
        self.event_key = key.into();
        self
    }

    /// The signing key calls are signed with and the API's bearer is checked against (default:
    /// a random `signkey-test-<hex>`). Keep it hex after the prefix: the SDKs hash its bytes.
    pub fn signing_key(mut self, key: impl Into<String>) -> Self {
        self.signing_key = Some(key.into());
        self
    }

    /// A second key the API's bearer may use, as during a rotation.
    pub fn signing_key_fallback(mut self, key: impl Into<String>) -> Self {
        self.signing_key_fallback = Some(key.into());
        self
    }

    /// How long an event's own `id` keeps a second run of a function from starting (24 hours).
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = window;
        self
    }

    /// Multiplies the retry backoff (0.001 turns the first retry's 15 s into 15 ms). Sleeps and
    /// `Retry-After` are waited out as given.
    pub fn time_scale(mut self, scale: f64) -> Self {
        self.time_scale = scale.max(0.0);
        self
    }

    /// The most steps a run may memoize (1,000, Inngest's limit): a step past it fails the run,
    /// which is announced as any failed run is.
    pub fn max_steps(mut self, steps: usize) -> Self {
        self.max_steps = steps;
        self
    }

    /// Starts on 127.0.0.1 at a free port.
    pub async fn start_local(self) -> Result<Emulator, Error> {
        self.start(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts on `addr`, which must be a loopback address.
    pub async fn start(self, addr: SocketAddr) -> Result<Emulator, Error> {
        if !addr.ip().is_loopback() {
            return Err(Error(format!("{addr} is not a loopback address: the emulator is for local use only")));
        }
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error(format!("bind {addr}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| Error(e.to_string()))?;
        let shared = Arc::new(Shared {
            config: Config {
                event_key: self.event_key,
                signing_key: self.signing_key.unwrap_or_else(sign::random_key),
                signing_key_fallback: self.signing_key_fallback,
                dedupe_window: self.dedupe_window,
                time_scale: self.time_scale,
                max_steps: self.max_steps,
            },
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .map_err(|e| Error(e.to_string()))?,
            event_requests: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            limits: Mutex::new(std::collections::HashMap::new()),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let app = server::router(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Emulator { shared, addr, stop: Mutex::new(Some(stop)), task: Mutex::new(Some(task)) })
    }
}

/// A running emulator. Dropping it leaves the server running until the runtime ends; call
/// [`shutdown`](Self::shutdown) to stop it.
#[derive(Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Emulator {
    /// A builder with the defaults.
    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder {
            event_key: "test-event-key".to_owned(),
            signing_key: None,
            signing_key_fallback: None,
            dedupe_window: Duration::from_secs(24 * 3600),
            time_scale: 1.0,
            max_steps: 1_000,
        }
    }

    /// The base URL (event API and API both): `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The event key the event API accepts.
    pub fn event_key(&self) -> &str {
        &self.shared.config.event_key
    }

    /// The signing key calls are signed with.
    pub fn signing_key(&self) -> &str {
        &self.shared.config.signing_key
    }

    /// Asks the app served at `app_url` to sync (a `PUT`, signed, as Inngest sends it); the app
    /// registers its functions with `POST /fn/register`. Returns the app's answer.
    pub async fn sync(&self, app_url: &str) -> Result<Value, Error> {
        let body = serde_jcs::to_vec(&json!({ "url": app_url })).expect("a JSON value serializes");
        let t = Utc::now().timestamp();
        let response = self
            .shared
            .http
            .put(app_url)
            .header("content-type", "application/json")
            .header("x-inngest-server-kind", "cloud")
            .header("x-inngest-signature", sign::signature(&self.shared.config.signing_key, &body, t))
            .body(body)
            .send()
            .await
            .map_err(|e| Error(format!("sync {app_url}: {e}")))?;
        let status = response.status();
        let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or(Value::Null);
        if status.is_success() { Ok(answer) } else { Err(Error(format!("sync {app_url}: {status}: {answer}"))) }
    }

    /// The functions registered.
    pub fn functions(&self) -> Vec<Function> {
        self.shared.lock().functions.clone()
    }

    /// Every run, oldest first.
    pub fn runs(&self) -> Vec<Run> {
        self.shared.lock().runs.clone()
    }

    /// Every call made to a function, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Every event received (and every `inngest/function.failed` sent), oldest first, as stored.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.iter().map(|(_, e)| e.clone()).collect()
    }

    /// Requests the event API received (each may carry many events).
    pub fn event_requests(&self) -> u64 {
        self.shared.event_requests.load(Ordering::Relaxed)
    }

    /// Sends events as the event API would take them; returns their ids.
    pub fn send(&self, events: Vec<Value>) -> Vec<String> {
        self.shared.ingest(events)
    }

    /// Waits until `done` holds of the runs, or `timeout` passes; returns the runs then.
    pub async fn wait_for_runs(&self, timeout: Duration, done: impl Fn(&[Run]) -> bool) -> Result<Vec<Run>, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.shared.changed.notified();
            let runs = self.runs();
            if done(&runs) {
                return Ok(runs);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let runs = self.runs();
                return if done(&runs) { Ok(runs) } else { Err(Error(format!("timed out; runs: {runs:#?}"))) };
            }
        }
    }

    /// Stops the server (runs in flight stop at their next call).
    pub async fn shutdown(&self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let mut state = self.shared.lock();
        for run in state.runs.iter_mut().filter(|r| r.status == RunStatus::Running) {
            run.status = RunStatus::Cancelled;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_handlers_expression_is_evaluated_and_others_never_fire() {
        let config = json!({
            "id": "app-fn-failure",
            "triggers": [{ "event": "inngest/function.failed", "expression": "event.data.function_id == 'app-fn'" }],
            "steps": { "step": { "runtime": { "url": "http://127.0.0.1:1/api/inngest?fnId=app-fn-failure&stepId=step" }, "retries": { "attempts": 0 } } },
        });
        let f = Function::from_config("app", &config).unwrap();
        assert_eq!(f.retries, 0);
        assert!(f.triggered_by(&json!({ "name": "inngest/function.failed", "data": { "function_id": "app-fn" } })));
        assert!(!f.triggered_by(&json!({ "name": "inngest/function.failed", "data": { "function_id": "app-other" } })));
        assert_eq!(equality("event.data.x > 3"), None);
        assert_eq!(equality("event.data.a.b == \"t\""), Some(("/data/a/b".to_owned(), "t".to_owned())));
    }
}
