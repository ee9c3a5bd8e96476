//! A local emulator of [Upstash QStash](https://upstash.com/docs/qstash)'s HTTP API, for tests
//! and offline development.
//!
//! It accepts messages on `POST /v2/publish/{url}`, `POST /v2/enqueue/{queue}/{url}` and
//! `POST /v2/batch`, delivers them to their destination with a signed `Upstash-Signature` JWT,
//! retries failures with QStash's backoff (scaled by [`EmulatorBuilder::time_scale`]), honours
//! `Retry-After`, dead-letters after the last retry or at once on `489` +
//! `Upstash-NonRetryable-Error: true`, holds each flow-control key to its parallelism and rate,
//! and serves the DLQ, signing keys, logs, messages, queues and flow-control APIs. The official clients (`@upstash/qstash`, PyPI `qstash`) work against it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redrive_qstash_emulator::Error> {
//! use redrive_qstash_emulator::Emulator;
//!
//! let emu = Emulator::builder().token("test-token").time_scale(0.001).start_local().await?;
//! println!("QSTASH_URL={} QSTASH_TOKEN={}", emu.url(), emu.token());
//! emu.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! It listens on loopback only and is not a production service: state lives in memory.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

mod engine;
mod server;
mod util;

use engine::{Config, Inner, Shared};

/// The current and next signing keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SigningKeys {
    /// The key deliveries are signed with.
    pub current: String,
    /// The key that becomes current on rotation.
    pub next: String,
}

/// A burst rate limit on message-creating requests (publish, enqueue, batch): at most `limit`
/// requests per `period`; beyond it the emulator answers `429` with QStash's
/// `Burst-RateLimit-Limit`, `Burst-RateLimit-Remaining` and `Burst-RateLimit-Reset` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests allowed per period.
    pub limit: u32,
    /// The window length.
    pub period: Duration,
}

impl RateLimit {
    /// `limit` requests per second.
    pub fn per_second(limit: u32) -> RateLimit {
        RateLimit { limit, period: Duration::from_secs(1) }
    }
}

/// One delivery attempt the emulator made (for test inspection).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message's id (`msg_...`).
    pub message_id: String,
    /// The destination URL.
    pub url: String,
    /// The HTTP method used.
    pub method: String,
    /// The `Upstash-Retried` value sent: 0 on the first attempt.
    pub retried: u32,
    /// The destination's status code; `None` when no response came (connection error, timeout).
    pub status: Option<u16>,
    /// Why no response came, when none did.
    pub error: Option<String>,
    /// The `Upstash-Signature` JWT sent.
    pub signature: String,
    /// When the attempt finished.
    pub at: SystemTime,
}

impl Delivery {
    /// Whether the destination answered 2xx.
    pub fn delivered(&self) -> bool {
        matches!(self.status, Some(s) if (200..300).contains(&s))
    }
}

/// Why the emulator could not start.
#[derive(Debug)]
pub enum Error {
    /// The bind address is not a loopback address; the emulator listens on loopback only.
    NonLoopback(SocketAddr),
    /// Binding the listener failed.
    Bind(SocketAddr, std::io::Error),
    /// The HTTP client for deliveries could not be built.
    Client(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NonLoopback(a) => {
                write!(f, "refusing to listen on {a}: the QStash emulator binds loopback addresses only")
            }
            Error::Bind(a, e) => write!(f, "could not listen on {a}: {e}"),
            Error::Client(e) => write!(f, "could not build the delivery HTTP client: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Bind(_, e) => Some(e),
            _ => None,
        }
    }
}

/// Entry point: [`Emulator::builder`].
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// A builder with QStash's defaults: 3 retries, a 10-minute dedupe window, real-time backoff,
    /// a random token and random signing keys, no quota, no rate limit, 30 s delivery timeout.
    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder::default()
    }
}

/// Configures and starts an emulator.
#[derive(Debug, Clone)]
pub struct EmulatorBuilder {
    token: Option<String>,
    keys: Option<SigningKeys>,
    config: Config,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        EmulatorBuilder {
            token: None,
            keys: None,
            config: Config {
                time_scale: 1.0,
                dedupe_window: Duration::from_secs(600),
                max_retries: 3,
                quota: None,
                rate_limit: None,
                default_timeout: Duration::from_secs(30),
            },
        }
    }
}

impl EmulatorBuilder {
    /// The bearer token the API accepts (others get `401`). Default: a random `qstash_...` string.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The current and next signing keys. Default: random `sig_...` strings.
    pub fn signing_keys(mut self, current: impl Into<String>, next: impl Into<String>) -> Self {
        self.keys = Some(SigningKeys { current: current.into(), next: next.into() });
        self
    }

    /// Multiplies QStash's default retry backoff `min(86400, e^(2.5 n))` seconds (e.g. `0.001`
    /// turns the first retry's 12 s into 12 ms). `Retry-After` and `Upstash-Retry-Delay` are not
    /// scaled: the destination or the publisher chose them. Default `1.0`.
    pub fn time_scale(mut self, scale: f64) -> Self {
        self.config.time_scale = if scale.is_finite() && scale >= 0.0 { scale } else { 1.0 };
        self
    }

    /// How long a deduplication id (or content hash) drops repeats. Default 10 minutes, as
    /// QStash's API reference says (the publish endpoint's `Upstash-Deduplication-Id`, and the
    /// deduplication page); `@upstash/qstash`'s JSDoc says ids are stored 90 days.
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.config.dedupe_window = window;
        self
    }

    /// Retries of a message published without `Upstash-Retries`. Default 3.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// Messages accepted in total before publish answers `412` (quota exceeded). Default none.
    pub fn quota(mut self, quota: Option<u64>) -> Self {
        self.config.quota = quota;
        self
    }

    /// A burst rate limit on publish/enqueue/batch requests. Default none.
    pub fn rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.config.rate_limit = limit;
        self
    }

    /// The delivery timeout when a message has no `Upstash-Timeout`. Default 30 s (not scaled).
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = timeout;
        self
    }

    /// Starts on `127.0.0.1` with a free port.
    pub async fn start_local(self) -> Result<RunningEmulator, Error> {
        self.start(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts listening on `addr` (a loopback address; port 0 picks a free port) and serving.
    pub async fn start(self, addr: SocketAddr) -> Result<RunningEmulator, Error> {
        if !addr.ip().is_loopback() {
            return Err(Error::NonLoopback(addr));
        }
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Bind(addr, e))?;
        let local = listener.local_addr().map_err(|e| Error::Bind(addr, e))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let keys = self
            .keys
            .unwrap_or_else(|| SigningKeys { current: util::random_signing_key(), next: util::random_signing_key() });
        let shared = Arc::new(Shared {
            config: self.config,
            token: self.token.unwrap_or_else(|| util::random_id("qstash_", 32)),
            inner: Mutex::new(Inner { keys, ..Inner::default() }),
            http,
            shutdown: stop_rx.clone(),
            publish_requests: Default::default(),
            changed: Notify::new(),
        });
        let app = server::router(shared.clone()).into_make_service_with_connect_info::<SocketAddr>();
        let mut stop = stop_rx;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        });
        tracing::info!(addr = %local, "QStash emulator listening");
        Ok(RunningEmulator { addr: local, shared, stop: stop_tx, server: Some(server) })
    }
}

/// Rotates the keys: current := next, and a new next.
pub(crate) fn rotate(shared: &Shared) -> SigningKeys {
    let mut inner = shared.lock();
    let next = util::random_signing_key();
    let old_next = std::mem::replace(&mut inner.keys.next, next);
    inner.keys.current = old_next;
    inner.keys.clone()
}

/// A started emulator. Dropping it stops the server and the deliveries.
#[derive(Debug)]
pub struct RunningEmulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

impl RunningEmulator {
    /// The base URL, e.g. `http://127.0.0.1:8585` (what the clients call `QSTASH_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token it accepts (`QSTASH_TOKEN`).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The key deliveries are signed with now (`QSTASH_CURRENT_SIGNING_KEY`).
    pub fn current_signing_key(&self) -> String {
        self.shared.lock().keys.current.clone()
    }

    /// The next key (`QSTASH_NEXT_SIGNING_KEY`).
    pub fn next_signing_key(&self) -> String {
        self.shared.lock().keys.next.clone()
    }

    /// Both keys.
    pub fn signing_keys(&self) -> SigningKeys {
        self.shared.lock().keys.clone()
    }

    /// Rotates like `POST /v2/keys/rotate`: the next key becomes current, a new next is made.
    pub fn rotate_keys(&self) -> SigningKeys {
        rotate(&self.shared)
    }

    /// How many publish, enqueue and batch requests arrived (authorized ones, whatever their outcome).
    pub fn publish_requests(&self) -> u64 {
        self.shared.publish_requests.load(Ordering::Relaxed)
    }

    /// How many messages were accepted (deduplicated repeats not counted).
    pub fn messages_accepted(&self) -> u64 {
        self.shared.lock().accepted
    }

    /// Every delivery attempt so far, in order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.lock().deliveries.clone()
    }

    /// The delivery attempts of one message, in order.
    pub fn deliveries_of(&self, message_id: &str) -> Vec<Delivery> {
        self.shared.lock().deliveries.iter().filter(|d| d.message_id == message_id).cloned().collect()
    }

    /// How many messages wait (or are being delivered or retried).
    pub fn pending(&self) -> usize {
        self.shared.lock().messages.len()
    }

    /// The DLQ ids, oldest first.
    pub fn dlq_ids(&self) -> Vec<String> {
        self.shared.lock().dlq.values().map(|e| e.dlq_id.clone()).collect()
    }

    /// The DLQ entries as `GET /v2/dlq/{dlqId}` shows them, oldest first.
    pub fn dlq_entries(&self) -> Vec<serde_json::Value> {
        self.shared.lock().dlq.values().map(|e| e.to_json()).collect()
    }

    /// Waits until `pred` holds for the emulator or `timeout` passes; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, mut pred: impl FnMut(&RunningEmulator) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.shared.changed.notified();
            if pred(self) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // Poll too, in case a change slipped between the check and the wait.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(20)), changed).await;
        }
    }

    /// Waits until at least `n` delivery attempts were made; returns them (maybe fewer on timeout).
    pub async fn wait_for_deliveries(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        self.wait_until(timeout, |e| e.shared.lock().deliveries.len() >= n).await;
        self.deliveries()
    }

    /// Waits until the DLQ holds at least `n` entries; returns whether it did in time.
    pub async fn wait_for_dlq(&self, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |e| e.shared.lock().dlq.len() >= n).await
    }

    /// Stops serving and delivering, and waits for the server to close.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
