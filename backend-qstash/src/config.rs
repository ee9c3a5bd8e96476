//! The backend's settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::{Error, ErrorKind, Flow, Result};

use crate::flow::FlowSource;

/// Where the receiver reads the time for a signature's `exp` and `nbf` (tests move it).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// QStash's current and next signing keys (Upstash console, or `GET /v2/keys`). Never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeys {
    /// Signs deliveries now.
    pub current: String,
    /// Signs deliveries after the next rotation; accepted too, so a rotation drops nothing.
    pub next: String,
}

impl fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKeys(<redacted>)")
    }
}

/// How to reach QStash and how the receiver checks what it delivers.
#[derive(Clone)]
pub struct QStashConfig {
    pub(crate) api_url: String,
    pub(crate) token: String,
    pub(crate) destination: String,
    pub(crate) queue: Option<String>,
    pub(crate) signing_keys: Option<SigningKeys>,
    pub(crate) delivery_timeout: Duration,
    pub(crate) park_limit: Duration,
    pub(crate) max_parked: usize,
    pub(crate) unclaimed_rounds: u32,
    pub(crate) leeway: Duration,
    pub(crate) max_message: usize,
    pub(crate) max_retries: u32,
    pub(crate) plain_http: bool,
    pub(crate) clock: Clock,
    pub(crate) flow: Option<FlowSource>,
}

impl fmt::Debug for QStashConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QStashConfig")
            .field("api_url", &self.api_url)
            .field("destination", &self.destination)
            .field("queue", &self.queue)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("max_parked", &self.max_parked)
            .field("leeway", &self.leeway)
            .field("max_message", &self.max_message)
            .field("max_retries", &self.max_retries)
            .field("flow", &self.flow.is_some())
            .finish_non_exhaustive()
    }
}

/// QStash's API.
pub(crate) const QSTASH_URL: &str = "https://qstash.upstash.io";

impl QStashConfig {
    /// A backend publishing with `token` to `destination`, the public URL where
    /// [`QStashBackend::receiver`](crate::QStashBackend::receiver) is mounted (https). The signing
    /// keys are read from `GET /v2/keys` at connect unless given with [`Self::with_signing_keys`].
    pub fn new(token: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            api_url: QSTASH_URL.into(),
            token: token.into(),
            destination: destination.into(),
            queue: None,
            signing_keys: None,
            delivery_timeout: Duration::from_secs(300),
            park_limit: Duration::from_secs(20),
            max_parked: 256,
            unclaimed_rounds: 20,
            leeway: Duration::from_secs(5),
            max_message: 1_000_000,
            max_retries: 5,
            plain_http: false,
            clock: Arc::new(Utc::now),
            flow: None,
        }
    }

    /// Another QStash API (a region, or the emulator for offline work).
    pub fn with_api_url(mut self, url: impl Into<String>) -> Self {
        self.api_url = url.into().trim_end_matches('/').to_owned();
        self
    }

    /// Publishes through the named QStash queue (`/v2/enqueue/{queue}/…`): its parallelism caps
    /// how many deliveries run at once.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The signing keys the receiver accepts.
    pub fn with_signing_keys(mut self, current: impl Into<String>, next: impl Into<String>) -> Self {
        self.signing_keys = Some(SigningKeys { current: current.into(), next: next.into() });
        self
    }

    /// How long QStash waits for the receiver's answer (`Upstash-Timeout`; 5 minutes). A handler
    /// cannot hold its delivery longer: renewals stop there. Keep it within your plan's limit.
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// How long a delivery waits for a worker of this process to claim it (20 s) before it is
    /// handed back to QStash as a delayed copy, at no attempt's cost.
    pub fn with_park_limit(mut self, limit: Duration) -> Self {
        self.park_limit = limit;
        self
    }

    /// How many deliveries the receiver holds at once, waiting for a worker or running (256).
    /// Past it a delivery is answered 503 with `Retry-After` before its body is read, rather than
    /// held in memory. QStash counts that answer against the message's retries, as it counts
    /// any non-2xx answer; this process does not count it as an attempt of the job. Keep it
    /// above your workers' concurrency, so that only an overload meets it.
    pub fn with_max_parked(mut self, deliveries: usize) -> Self {
        self.max_parked = deliveries;
        self
    }

    /// How many times in a row a delivery of a kind no worker of this process has ever claimed
    /// is handed back unclaimed (each a new message, billed) before it is dead-lettered as a
    /// record, with an alert (20: with the default park limit, about a quarter of an hour, room
    /// for a rolling deploy to bring the kind's workers). A delivery left unclaimed because the
    /// workers that handle its kind are busy is not counted.
    pub fn with_unclaimed_rounds(mut self, rounds: u32) -> Self {
        self.unclaimed_rounds = rounds;
        self
    }

    /// Clock skew accepted on a signature's `exp` and `nbf` (5 s).
    pub fn with_leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// The largest message your plan takes, in bytes (1 MB); the receiver refuses bodies over it.
    pub fn with_max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The most retries your plan allows; a job whose cap needs more is refused at enqueue (5).
    pub fn with_max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Allows `http://` for the API and the destination: for the emulator on loopback, never for
    /// production, where QStash would deliver jobs and signatures in clear text.
    pub fn allow_plain_http(mut self) -> Self {
        self.plain_http = true;
        self
    }

    /// Says each kind's limits to QStash as its own flow control, read from `flow`: the store the
    /// workers keep them in (your ledger's database, e.g. `redrive_postgres::PgBackend`). Every
    /// message of a kind with a `concurrency` or a `rate` then carries `Upstash-Flow-Control-Key`
    /// (one per destination and kind: QStash's keys are the account's) and
    /// `Upstash-Flow-Control-Value`, and QStash holds back the deliveries the workers would
    /// otherwise defer, each deferral a message published again. The limits are read at most every
    /// 5 seconds; the workers keep every limit still, the per-key ones and any QStash cannot say
    /// (a period under a second) included.
    pub fn with_flow(mut self, flow: impl Flow + 'static) -> Self {
        self.flow = Some(FlowSource(Arc::new(flow)));
        self
    }

    /// The clock the receiver checks `exp` and `nbf` against (a test aid).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        for (what, url) in [("the QStash API URL", &self.api_url), ("the destination", &self.destination)] {
            let Some((scheme, rest)) = url.split_once("://") else {
                return Err(Error::new(ErrorKind::Config, format!("{what} is not a URL")));
            };
            if rest.is_empty() {
                return Err(Error::new(ErrorKind::Config, format!("{what} has no host")));
            }
            match scheme {
                "https" => {}
                "http" if self.plain_http => {}
                "http" => {
                    return Err(Error::new(
                        ErrorKind::Config,
                        format!("{what} must be https (allow_plain_http() is for the emulator on loopback)"),
                    ));
                }
                _ => return Err(Error::new(ErrorKind::Config, format!("{what} must be an https URL"))),
            }
        }
        if let Some(queue) = &self.queue {
            let valid = !queue.is_empty()
                && queue.len() <= 100
                && queue.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !valid {
                return Err(Error::new(
                    ErrorKind::InvalidName,
                    "a QStash queue name takes 1 to 100 letters, digits, '-', '_' or '.'",
                ));
            }
        }
        if self.token.is_empty() {
            return Err(Error::new(ErrorKind::Config, "no QStash token"));
        }
        if self.max_parked == 0 || self.unclaimed_rounds == 0 {
            return Err(Error::new(ErrorKind::Config, "the park bound and the unclaimed rounds must be at least 1"));
        }
        if self.delivery_timeout < Duration::from_secs(2) {
            return Err(Error::new(ErrorKind::Config, "the delivery timeout must be at least 2 s"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_refused_unless_allowed() {
        let config = QStashConfig::new("t", "http://app.example.com/qstash");
        let e = config.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("https"), "{e}");
        assert!(config.allow_plain_http().with_api_url("http://127.0.0.1:1").check().is_ok());
        assert!(QStashConfig::new("t", "ftp://x").check().is_err());
        assert!(QStashConfig::new("t", "https://x/q").with_queue("bad name").check().is_err());
    }
}
