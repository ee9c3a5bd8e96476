//! Alerts: fired once per failure record, when the worker writes it.

use std::pin::Pin;

use chrono::{DateTime, Utc};

use crate::backend::FailureRecord;
use crate::error::Result;
use crate::job::Severity;

/// A boxed future, for the object-safe [`AlertSink`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A new failure record, announced.
#[derive(Debug, Clone)]
pub struct Alert {
    /// The record (sinks must not print its payload).
    pub record: FailureRecord,
    /// When the alert was raised.
    pub raised_at: DateTime<Utc>,
    /// 0 for the record's alert; n for its n-th reminder while it stays open (see
    /// [`WorkerConfig::remind_after`](crate::WorkerConfig::remind_after)).
    pub reminder: u32,
}

impl Alert {
    /// One line for a person: kind, key, attempts, record id, the last error and, where the
    /// record keeps one, the failing attempt's trace id (to look up in the tracing backend). No
    /// payload.
    pub fn summary(&self) -> String {
        let r = &self.record;
        let reminder = match self.reminder {
            0 => String::new(),
            n => {
                let hours = (self.raised_at - r.last_failed_at).num_minutes() as f64 / 60.0;
                format!("reminder {n}, still open after {hours:.1} h: ")
            }
        };
        let trace = r.trace_id.as_ref().map(|id| format!(", trace {id}")).unwrap_or_default();
        format!(
            "[{:?}] {reminder}job `{}` failed for good after {}/{} attempts: key {}, record {}{trace}, last error: {}",
            r.severity, r.kind, r.attempts, r.cap, r.key, r.id, r.last_error
        )
    }
}

/// A kind paused by its circuit breaker: its jobs failed one after another, so they wait (at no
/// attempt's cost) instead of each using up its attempts into a failure record. Sent once per
/// pause, by the worker whose pause stood.
#[derive(Debug, Clone)]
pub struct PauseAlert {
    /// The job kind.
    pub kind: String,
    /// Retryable failures in a row that tripped the breaker.
    pub failures: u32,
    /// The last of them, as the handler said it (never a payload).
    pub last_error: String,
    /// How often a probe job is let through; the kind resumes when one succeeds.
    pub probe_every: std::time::Duration,
    /// When.
    pub raised_at: DateTime<Utc>,
}

impl PauseAlert {
    /// One line for a person: which kind, why, and what happens next.
    pub fn summary(&self) -> String {
        format!(
            "job kind `{}` paused by its circuit breaker after {} failures in a row (last error: {}); its jobs wait without spending attempts, a probe runs every {:?}, and the kind resumes when one succeeds (`redrive kind resume {}` resumes it now)",
            self.kind, self.failures, self.last_error, self.probe_every, self.kind
        )
    }
}

/// Where alerts go. Object-safe, so a worker can hold several.
pub trait AlertSink: Send + Sync + 'static {
    /// Delivers one alert. An error is logged by the worker; the record is kept either way.
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>>;

    /// Announces a kind its circuit breaker paused. By default it is logged at error level, as
    /// [`TracingAlerts`] does; a sink that pages implements it to page.
    fn paused<'a>(&'a self, alert: &'a PauseAlert) -> BoxFuture<'a, Result<()>> {
        tracing::error!(kind = %alert.kind, "{}", alert.summary());
        Box::pin(std::future::ready(Ok(())))
    }

    /// What the sink is (`"tracing"`, `"webhook"`; `"custom"` unless a sink says): kept with
    /// each alert it delivered, so that `redrive doctor` can tell records whose alert only
    /// reached the log.
    fn name(&self) -> &'static str {
        "custom"
    }
}

/// Routes by severity: [`at_least`](AlertSinkExt::at_least) passes on only the alerts of records
/// that severe or more, so that a pager hears of a failed credit grant and not of a failed
/// receipt, while a chat channel hears of both:
///
/// ```
/// use redrive_core::alert::{self, AlertSinkExt};
/// use redrive_core::Severity;
///
/// let pager = alert::from_fn(|alert| async move { /* page */ Ok(()) }).at_least(Severity::Critical);
/// # let _ = pager;
/// ```
///
/// The worker counts an alert held back as delivered: it is not retried and not sent later.
pub trait AlertSinkExt: AlertSink + Sized {
    /// This sink, for records of `severity` or above only.
    fn at_least(self, severity: Severity) -> AtLeast<Self> {
        AtLeast { sink: self, severity }
    }
}

impl<S: AlertSink> AlertSinkExt for S {}

/// The sink [`AlertSinkExt::at_least`] makes.
#[derive(Debug, Clone)]
pub struct AtLeast<S> {
    sink: S,
    severity: Severity,
}

impl<S: AlertSink> AlertSink for AtLeast<S> {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>> {
        if alert.record.severity >= self.severity { self.sink.send(alert) } else { Box::pin(async { Ok(()) }) }
    }

    /// A paused kind stops all of its jobs, whatever their severity: always passed on.
    fn paused<'a>(&'a self, alert: &'a PauseAlert) -> BoxFuture<'a, Result<()>> {
        self.sink.paused(alert)
    }

    fn name(&self) -> &'static str {
        self.sink.name()
    }
}

/// An alert sink from a closure that takes the alert and returns a future:
///
/// ```
/// use redrive_core::alert::{self, Alert};
///
/// let sink = alert::from_fn(|alert: Alert| async move {
///     // Post `alert.summary()` to your pager; never the record's payload.
///     println!("{}", alert.summary());
///     Ok(())
/// });
/// # let _ = sink;
/// ```
///
/// The closure gets its own copy of the alert, so the future it returns may keep it. An error
/// is logged by the worker, like any sink's. [`WorkerBuilder::alert_fn`](crate::WorkerBuilder::alert_fn)
/// adds one to a worker directly.
pub fn from_fn<F, Fut>(send: F) -> FnSink<F>
where
    F: Fn(Alert) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    FnSink(send)
}

/// The sink [`from_fn`] makes.
pub struct FnSink<F>(F);

impl<F> std::fmt::Debug for FnSink<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnSink")
    }
}

impl<F, Fut> AlertSink for FnSink<F>
where
    F: Fn(Alert) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>> {
        Box::pin((self.0)(alert.clone()))
    }
}

/// Logs each alert as a `tracing` error event (kind, key, record id, attempts; no payload).
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingAlerts;

impl AlertSink for TracingAlerts {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>> {
        let r = &alert.record;
        tracing::error!(
            record = %r.id, job_id = %r.job_id, kind = %r.kind, key = %r.key,
            attempts = r.attempts, severity = ?r.severity, last_error = %r.last_error,
            trace_id = r.trace_id.as_deref(),
            "failure record written"
        );
        Box::pin(async { Ok(()) })
    }

    fn name(&self) -> &'static str {
        "tracing"
    }
}

#[cfg(feature = "webhook")]
pub use webhook::WebhookAlerts;

#[cfg(feature = "webhook")]
mod webhook {
    use std::time::Duration;

    use super::{Alert, AlertSink, BoxFuture, PauseAlert};
    use crate::error::{Error, ErrorKind, Result};

    /// Posts each alert as Slack-compatible JSON (`{"text": …}`) to a webhook URL.
    ///
    /// The URL is a secret (it carries the webhook's token): it is never logged.
    #[derive(Debug, Clone)]
    pub struct WebhookAlerts {
        client: reqwest::Client,
        url: reqwest::Url,
    }

    impl WebhookAlerts {
        /// A sink posting to `url`, with a 5-second timeout.
        pub fn new(url: &str) -> Result<Self> {
            let url = reqwest::Url::parse(url)
                .map_err(|_| Error::new(ErrorKind::Config, "the webhook URL does not parse"))?;
            Self::with_timeout(url, Duration::from_secs(5))
        }

        /// A sink posting to `url`, giving up after `timeout`.
        pub fn with_timeout(url: reqwest::Url, timeout: Duration) -> Result<Self> {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .map_err(|e| Error::new(ErrorKind::Config, "cannot build the webhook client").with_source(e))?;
            Ok(Self { client, url })
        }
    }

    impl AlertSink for WebhookAlerts {
        fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>> {
            Box::pin(self.post(alert.summary()))
        }

        fn paused<'a>(&'a self, alert: &'a PauseAlert) -> BoxFuture<'a, Result<()>> {
            Box::pin(self.post(alert.summary()))
        }

        fn name(&self) -> &'static str {
            "webhook"
        }
    }

    impl WebhookAlerts {
        /// Posts one line, as Slack's incoming webhooks take it.
        async fn post(&self, text: String) -> Result<()> {
            {
                let body = serde_json::json!({ "text": text });
                let response = self
                    .client
                    .post(self.url.clone())
                    .json(&body)
                    .send()
                    .await
                    // `without_url`: the URL holds the webhook's secret.
                    .map_err(|e| Error::temporary("alert webhook unreachable").with_source(e.without_url()))?;
                if !response.status().is_success() {
                    return Err(Error::temporary(format!("alert webhook answered {}", response.status())));
                }
                Ok(())
            }
        }
    }
}

#[cfg(all(test, feature = "webhook"))]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::backend::{FailureId, RecordState};
    use crate::job::{JobId, Severity};
    use crate::key::{IdempotencyKey, ProviderKey};

    fn alert() -> Alert {
        let now = Utc::now();
        Alert {
            record: FailureRecord {
                id: FailureId("7".into()),
                job_id: JobId("3".into()),
                kind: "send_receipt".into(),
                key: IdempotencyKey::builder("send_receipt").fact("order", 42).build().unwrap(),
                provider_key: ProviderKey::mint(),
                payload: serde_json::json!({"email": "secret@example.com"}),
                last_error: "smtp 550".into(),
                errors: vec![],
                attempts: 5,
                cap: 5,
                severity: Severity::Error,
                first_failed_at: now,
                last_failed_at: now,
                state: RecordState::Open,
                replay_of: None,
                amended: None,
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            },
            raised_at: now,
            reminder: 0,
        }
    }

    #[tokio::test]
    async fn webhook_posts_slack_json_without_the_payload() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the JSON body has arrived (small request: headers + body).
            while !request.ends_with(b"}") {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
            String::from_utf8(request).unwrap()
        });
        WebhookAlerts::new(&url).unwrap().send(&alert()).await.unwrap();
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /hook"), "{request}");
        let body: serde_json::Value = serde_json::from_str(request.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let text = body["text"].as_str().unwrap();
        assert!(text.contains("send_receipt:order=42") && text.contains("5/5"), "{text}");
        assert!(text.contains("trace 4bf92f3577b34da6a3ce929d0e0e4736"), "the alert leads to the trace: {text}");
        assert!(!request.contains("secret@example.com"), "the payload never leaves in an alert");
    }

    #[tokio::test]
    async fn an_unreachable_webhook_is_a_temporary_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        drop(listener);
        let err = WebhookAlerts::new(&url).unwrap().send(&alert()).await.unwrap_err();
        assert!(err.is_temporary());
        assert!(!err.to_string().contains("/hook"), "the URL is a secret: {err}");
    }
}
