//! Jobs: the typed job API, the job as it is enqueued and as it is claimed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};
use crate::key::{IdempotencyKey, KeyBuilder, ProviderKey, check_name};
use crate::redact::debug_redacted;

/// The attempt cap a job gets when its type names none.
pub const DEFAULT_CAP: u32 = 5;

/// The longest [`Job::order_key`], in bytes.
pub const MAX_ORDER_KEY: usize = 255;

/// The lowest and the highest [`NewJob::priority`]: -100 to 100, 0 by default.
pub const PRIORITIES: std::ops::RangeInclusive<i16> = -100..=100;

/// How loudly a failure record of this job should page someone. Ordered: `Warning` <
/// `Error` < `Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth a look during working hours.
    Warning,
    /// Someone should act on it (the default).
    #[default]
    Error,
    /// Money or data is at stake: page now.
    Critical,
}

impl Severity {
    /// The lower-case name (`warning`, `error`, `critical`): as serde writes it, and as the
    /// backends store it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
        }
    }

    /// The severity of that lower-case name, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "warning" => Some(Self::Warning),
            "error" => Some(Self::Error),
            "critical" => Some(Self::Critical),
            _ => None,
        }
    }
}

/// A typed job: its kind, how its key derives from its own fields, and optionally its cap and
/// severity.
///
/// ```
/// use redrive_core::{Job, KeyBuilder};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendReceipt { order_id: u64, email: String }
///
/// impl Job for SendReceipt {
///     const KIND: &'static str = "send_receipt";
///     // One receipt per order: the email address is not part of the effect's identity.
///     fn key(&self, key: KeyBuilder) -> KeyBuilder {
///         key.fact("order", self.order_id)
///     }
/// }
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + 'static {
    /// The job kind, `[A-Za-z0-9_.-]{1,64}`.
    const KIND: &'static str;
    /// The most attempts this kind gets; `None` means [`DEFAULT_CAP`].
    const CAP: Option<u32> = None;
    /// How loudly its failure records alert.
    const SEVERITY: Severity = Severity::Error;
    /// Work that is worthless late (a typing indicator, a cache warm-up): claimed this long after
    /// it was enqueued, the job is dropped and counted as expired, not run and not dead-lettered.
    const EXPIRES_AFTER: Option<Duration> = None;
    /// The longest one attempt may run: at the limit the handler's future is dropped (whatever
    /// it was awaiting is cancelled) and the attempt counts as a retryable failure, "timed out
    /// after …". `None`: no limit (a hung handler holds its key for as long as its worker lives).
    /// A worker may set its own with [`WorkerBuilder::timeout`](crate::WorkerBuilder::timeout).
    const TIMEOUT: Option<Duration> = None;

    /// Adds the business facts that identify this job's one intended effect.
    fn key(&self, key: KeyBuilder) -> KeyBuilder;

    /// The fact a kind's per-key limits count by ([`Limits::key_concurrency`](crate::Limits),
    /// [`Limits::key_rate`](crate::Limits)): a tenant, an account. Jobs with the same value share
    /// the limit; the rest of the kind is unaffected. `None` (the default): the job is counted by
    /// the kind's limits alone.
    fn limit_key(&self) -> Option<String> {
        None
    }

    /// The fact whose jobs must run one at a time, in the order they were enqueued (an account,
    /// an order id), across kinds: a later job of the same order key waits while an earlier one
    /// is queued, running, retrying, or failed with its record open (until the record is
    /// replayed, which keeps the job's place, or discarded). `None` (the default): no order.
    /// Only backends whose [`Capabilities::order_per_key`](crate::kit::Capabilities) is set keep
    /// it; the others refuse such a job at enqueue rather than run it out of order. A key also
    /// waits behind an earlier job that is not failing: one of a kind no worker handles, one
    /// scheduled later, one of a paused kind.
    fn order_key(&self) -> Option<String> {
        None
    }

    /// Claimed before every ready job of a lower priority, after every one of a higher; jobs of
    /// one priority oldest first, as without priorities. In [`PRIORITIES`], 0 (the default)
    /// unless said. An order key outranks it: a job still waits for the earlier ones of its key. Only
    /// backends whose [`Capabilities::priorities`](crate::kit::Capabilities) is set order claims
    /// by it; the others refuse a job of any other priority than 0 at enqueue.
    fn priority(&self) -> i16 {
        0
    }
}

/// A job ready to enqueue: its keys are fixed here, once, and never re-derived by a retry.
#[derive(Clone, PartialEq)]
pub struct NewJob {
    /// The job kind.
    pub kind: String,
    /// The business-fact key.
    pub key: IdempotencyKey,
    /// The provider key, minted when this value was made.
    pub provider_key: ProviderKey,
    /// The payload, as JSON.
    pub payload: Value,
    /// The attempt cap.
    pub cap: u32,
    /// The alert severity.
    pub severity: Severity,
    /// Worthless after this time: claimed later, the job is dropped and counted as expired, not
    /// run and not dead-lettered. `None`: no deadline.
    pub deadline: Option<DateTime<Utc>>,
    /// Not to run before this time (see [`EnqueueExt::enqueue_at`](crate::EnqueueExt::enqueue_at)).
    /// `None`: as soon as a worker is free.
    pub not_before: Option<DateTime<Utc>>,
    /// Runs after every earlier job of this order key is done (see [`Job::order_key`]).
    pub order_key: Option<String>,
    /// The failure record this job replays, set by a broker's [`Replay`](crate::Replay): the
    /// job's settlement confirms that record or links it to the next. A producer leaves it
    /// `None`.
    pub replay_of: Option<crate::backend::FailureId>,
    /// Claimed before the ready jobs of lower priorities (see [`Job::priority`]).
    pub priority: i16,
    /// The producer's trace context, a W3C `traceparent` (see [`with_traceparent`](Self::with_traceparent)).
    /// With the `otel` feature, [`new`](Self::new) fills it from the current `tracing` span.
    pub traceparent: Option<String>,
}

impl NewJob {
    /// Builds the job from a typed value: derives its key and mints its provider key.
    pub fn from_job<J: Job>(job: &J) -> Result<Self> {
        let key = job.key(IdempotencyKey::builder(J::KIND)).build()?;
        let payload = serde_json::to_value(job)
            .map_err(|e| Error::new(ErrorKind::Decode, "job does not serialize to JSON").with_source(e))?;
        let mut new = Self::new(J::KIND, key, payload)?;
        new.cap = J::CAP.unwrap_or(DEFAULT_CAP).max(1);
        new.severity = J::SEVERITY;
        if let Some(after) = J::EXPIRES_AFTER {
            new = new.expires_in(after);
        }
        if let Some(order) = job.order_key() {
            new = new.with_order_key(order)?;
        }
        new.with_priority(job.priority())
    }

    /// Builds a job from its parts, for producers without a Rust type for it.
    pub fn new(kind: impl Into<String>, key: IdempotencyKey, payload: Value) -> Result<Self> {
        let kind = kind.into();
        check_name("job kind", &kind)?;
        Ok(Self {
            kind,
            key,
            provider_key: ProviderKey::mint(),
            payload,
            cap: DEFAULT_CAP,
            severity: Severity::default(),
            deadline: None,
            not_before: None,
            order_key: None,
            replay_of: None,
            priority: 0,
            traceparent: current_traceparent(),
        })
    }

    /// Carries the producer's trace context with the job, a W3C `traceparent`
    /// (`00-<trace id>-<parent id>-<flags>`: version 00, a 32-hex trace id and a 16-hex parent id
    /// not all zeros, 2-hex flags, lower case), else [`ErrorKind::InvalidInput`]. The job's span
    /// follows it (with the `otel` feature) and its failure record keeps its trace id
    /// ([`FailureRecord::trace_id`](crate::FailureRecord::trace_id)).
    pub fn with_traceparent(mut self, traceparent: impl Into<String>) -> Result<Self> {
        let traceparent = traceparent.into();
        self.check_traceparent(Some(&traceparent))?;
        self.traceparent = Some(traceparent);
        Ok(self)
    }

    fn check_traceparent(&self, traceparent: Option<&str>) -> Result<()> {
        match traceparent.and_then(crate::trace::invalid) {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("the traceparent of job {} is not a W3C trace context: {why}", self.key),
            )),
        }
    }

    /// Runs the job after every earlier job of `order` (see [`Job::order_key`]): 1 to
    /// [`MAX_ORDER_KEY`] bytes without control characters, else [`ErrorKind::InvalidKey`].
    pub fn with_order_key(mut self, order: impl Into<String>) -> Result<Self> {
        let order = order.into();
        if order.is_empty() || order.len() > MAX_ORDER_KEY || order.chars().any(char::is_control) {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "the order key of job {} must be 1 to {MAX_ORDER_KEY} bytes without control characters",
                    self.key
                ),
            ));
        }
        self.order_key = Some(order);
        Ok(self)
    }

    /// Claims the job before the ready jobs of lower priorities (see [`Job::priority`]): in
    /// [`PRIORITIES`], else [`ErrorKind::InvalidInput`].
    pub fn with_priority(mut self, priority: i16) -> Result<Self> {
        if !PRIORITIES.contains(&priority) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "the priority of job {} is {priority}, outside {} to {}",
                    self.key,
                    PRIORITIES.start(),
                    PRIORITIES.end()
                ),
            ));
        }
        self.priority = priority;
        Ok(self)
    }

    /// Runs the job no earlier than `at`.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.not_before = Some(at);
        self
    }

    /// Runs the job no earlier than `after` from now.
    pub fn run_in(self, after: Duration) -> Self {
        let at = Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
        self.run_at(at)
    }

    /// Drops the job, unrun, if it is claimed after `at`.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.deadline = Some(at);
        self
    }

    /// Drops the job, unrun, if it is claimed more than `after` from now.
    pub fn expires_in(self, after: Duration) -> Self {
        let at = Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
        self.expires_at(at)
    }

    /// Sets the attempt cap (at least 1).
    pub fn with_cap(mut self, cap: u32) -> Self {
        self.cap = cap.max(1);
        self
    }

    /// The payload's fingerprint; see [`payload_fingerprint`].
    pub fn fingerprint(&self) -> String {
        payload_fingerprint(&self.payload)
    }

    /// A broker's deduplication id for the job: its key and its payload's fingerprint, hashed (64
    /// hex characters). A copy of the job within the broker's window is dropped; the same key with
    /// another payload is not dropped silently (as an id of the key alone would be) but delivered,
    /// and the effect ledger turns it into a key-conflict record with an alert. SQS FIFO and
    /// QStash use it.
    pub fn dedupe_id(&self) -> String {
        payload_fingerprint(&serde_json::json!([self.key.as_str(), self.fingerprint()]))
    }

    /// The payload's size in bytes as compact JSON, the figure checked against a backend's limit.
    pub fn payload_len(&self) -> usize {
        serde_json::to_vec(&self.payload).map_or(usize::MAX, |v| v.len())
    }

    /// Refuses what a backend with these capabilities cannot keep: a payload over its limit
    /// ([`ErrorKind::PayloadTooLarge`]), an order key where it keeps no order
    /// ([`ErrorKind::InvalidInput`]: run out of order, the job would break the promise its order
    /// key makes), a priority outside [`PRIORITIES`], or other than 0 where claims ignore
    /// priorities ([`ErrorKind::InvalidInput`]: the documented pattern there is a queue per
    /// priority), a [`traceparent`](Self::traceparent) that is not a W3C trace context
    /// ([`ErrorKind::InvalidInput`]).
    pub fn check_fits(&self, capabilities: &crate::kit::Capabilities) -> Result<()> {
        self.check_size(capabilities.max_payload)?;
        if self.order_key.is_some() && !capabilities.order_per_key {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "job {} has an order key, and this backend does not keep order per key (see Capabilities::order_per_key)",
                    self.key
                ),
            ));
        }
        if !PRIORITIES.contains(&self.priority) {
            // The field is public: `with_priority` is not the only way to set it.
            return self.clone().with_priority(self.priority).map(|_| ());
        }
        // As public: stored, it must read back as a trace context.
        self.check_traceparent(self.traceparent.as_deref())?;
        if self.priority != 0 && !capabilities.priorities {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "job {} has priority {}, and this backend does not order claims by priority (see \
                     Capabilities::priorities): use a queue per priority, as docs/RUNBOOK.md says under \
                     \"Priorities on a broker\"",
                    self.key, self.priority
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a payload over `limit` bytes with [`ErrorKind::PayloadTooLarge`].
    pub fn check_size(&self, limit: usize) -> Result<()> {
        let len = self.payload_len();
        if len > limit {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!("payload of job {} is {len} bytes, over the limit of {limit}", self.key),
            ));
        }
        Ok(())
    }
}

/// The current `tracing` span's OpenTelemetry context as a `traceparent`: what a new job carries
/// with the `otel` feature. `None` without it, and where the span has no context.
fn current_traceparent() -> Option<String> {
    #[cfg(feature = "otel")]
    {
        crate::trace::otel::traceparent_of(&tracing::Span::current())
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// Hex SHA-256 of the payload's canonical JSON (object keys sorted, no whitespace), so that a
/// store that reorders keys (Postgres `jsonb`) still compares payloads correctly.
pub fn payload_fingerprint(payload: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut canonical = String::new();
    write(payload, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// A backend's id for a job: a row id, an SQS `MessageId`, a QStash `messageId`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub String);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A job as a worker receives it.
#[derive(Clone, PartialEq)]
pub struct JobRecord {
    /// The backend's id.
    pub id: JobId,
    /// The job kind.
    pub kind: String,
    /// The business-fact key.
    pub key: IdempotencyKey,
    /// The provider key, unchanged since the job was created.
    pub provider_key: ProviderKey,
    /// The payload.
    pub payload: Value,
    /// This attempt's number, counted at claim: 1 on the first delivery.
    pub attempt: u32,
    /// The attempt cap.
    pub cap: u32,
    /// The alert severity.
    pub severity: Severity,
    /// Its priority (see [`Job::priority`]); 0 on a backend without priorities.
    pub priority: i16,
    /// When the job was first enqueued.
    pub enqueued_at: DateTime<Utc>,
    /// Dropped unrun if claimed after this (see [`NewJob::deadline`]).
    pub deadline: Option<DateTime<Utc>>,
    /// Not to run before this time, where the backend could not hold the job back itself (a
    /// broker's delay is capped): the worker defers a job claimed early, at no attempt's cost.
    pub not_before: Option<DateTime<Utc>>,
    /// How many of its claims lapsed before a handler started (a worker died with the job
    /// claimed ahead); their attempts were given back. Where this is above 0 the worker marks the
    /// job started, by renewing its lease, before the handler runs, so that a job that kills its
    /// worker at once is charged for it.
    pub stranded: u32,
    /// Set by a backend that could not read the job it received (an SQS body that is not an
    /// [envelope](crate::kit::Envelope)): why, naming no value of it. The worker records such a job
    /// as a decode failure at once, and never hands it to a handler; `kind` and `payload` are
    /// then stand-ins (the payload holds the raw body for a person to read).
    pub undecodable: Option<String>,
    /// The failure record this job replays, where the job travels apart from its record (a
    /// broker's message): settled, the job confirms that record ([`Claim::confirm_replay`](crate::kit::Claim::confirm_replay))
    /// or its new record names it. `None` where the backend keeps the link itself.
    pub replay_of: Option<crate::backend::FailureId>,
    /// The producer's trace context ([`NewJob::traceparent`]), where the job carries one.
    pub traceparent: Option<String>,
}

impl JobRecord {
    /// The trace id (32 hex digits) of the job's [`traceparent`](Self::traceparent), if it has
    /// a valid one: what its failure record keeps as
    /// [`FailureRecord::trace_id`](crate::FailureRecord::trace_id).
    pub fn trace_id(&self) -> Option<&str> {
        self.traceparent.as_deref().and_then(crate::trace::trace_id)
    }
}

/// What a handler knows about the job it runs.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The backend's id.
    pub job_id: JobId,
    /// The job kind.
    pub kind: String,
    /// This attempt's number, 1-based.
    pub attempt: u32,
    /// The attempt cap.
    pub cap: u32,
    /// The business-fact key.
    pub key: IdempotencyKey,
    /// Send this to providers that take an idempotency key of their own.
    pub provider_key: ProviderKey,
    /// An earlier attempt started the effect and did not finish: it may have reached the
    /// provider, so send the provider key and expect the provider to dedupe.
    pub earlier_attempt_pending: bool,
    /// The producer's trace context, a W3C `traceparent`, where the job carries one. With the
    /// `otel` feature the handler already runs in the job's span, which follows it.
    pub traceparent: Option<String>,
}

/// Why a handler did not finish, and what should happen next.
///
/// `?` turns any `std::error::Error` into a retryable `JobError`; say
/// [`JobError::permanent`] when retrying cannot help, and [`JobError::not_now`] when the job is
/// not at fault and should wait without spending an attempt (a rate limit, a maintenance window).
#[derive(Debug, Clone, PartialEq)]
pub struct JobError {
    message: String,
    retrying: Retrying,
}

/// Whether and when a failed attempt is tried again (below the cap: at the cap no retry is
/// left, whatever the handler asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retrying {
    /// Never: retrying cannot help, the job goes to a failure record now.
    Never,
    /// After the worker's [`Backoff`](crate::Backoff).
    Backoff,
    /// After this delay, instead of the backoff (a provider's `Retry-After`, say).
    After(Duration),
    /// Not now: put back for this delay at no attempt's cost, no error written, never a record
    /// (a 429 with `Retry-After`, a provider's maintenance window). Only while the job is younger
    /// than [`WorkerConfig::max_not_now`](crate::WorkerConfig::max_not_now); past that, an
    /// ordinary retry after the delay, so that a job cannot wait for ever unseen.
    NotNow(Duration),
}

impl JobError {
    /// Retry with the worker's backoff.
    pub fn retry(message: impl std::fmt::Display) -> Self {
        Self { message: message.to_string(), retrying: Retrying::Backoff }
    }

    /// Retry after `delay` (a provider's `Retry-After`, say).
    pub fn retry_after(delay: Duration, message: impl std::fmt::Display) -> Self {
        Self { message: message.to_string(), retrying: Retrying::After(delay) }
    }

    /// Not now, and not the job's fault: try again after `delay` without spending an attempt or
    /// writing an error (a 429 with `Retry-After`, a provider's maintenance window). No number of
    /// these leads to a failure record while the job is younger than
    /// [`WorkerConfig::max_not_now`](crate::WorkerConfig::max_not_now) (24 h by default); an
    /// older job's "not now" is an ordinary retry after `delay`, counted against its cap.
    /// Say [`retry_after`](Self::retry_after) when the job itself may be at fault.
    pub fn not_now(delay: Duration, message: impl std::fmt::Display) -> Self {
        Self { message: message.to_string(), retrying: Retrying::NotNow(delay) }
    }

    /// Do not retry: the job goes to a failure record now.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        Self { message: message.to_string(), retrying: Retrying::Never }
    }

    /// The message stored as the record's last error.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether and when the job is tried again.
    pub fn retrying(&self) -> Retrying {
        self.retrying
    }
}

impl<E: std::error::Error> From<E> for JobError {
    fn from(error: E) -> Self {
        Self::retry(error)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Grant {
        account: String,
        period: String,
        credits: u32,
    }

    impl Job for Grant {
        const KIND: &'static str = "grant_credits";
        const CAP: Option<u32> = Some(3);
        const SEVERITY: Severity = Severity::Critical;
        fn key(&self, key: KeyBuilder) -> KeyBuilder {
            key.fact("account", &self.account).fact("period", &self.period)
        }
    }

    #[test]
    fn typed_jobs_fix_key_cap_and_severity_once() {
        let job = Grant { account: "a1".into(), period: "2026-11".into(), credits: 10 };
        let first = NewJob::from_job(&job).unwrap();
        let second = NewJob::from_job(&job).unwrap();
        assert_eq!(first.key.as_str(), "grant_credits:account=a1:period=2026-11");
        assert_eq!(first.key, second.key, "the business key is the same every time");
        assert_ne!(first.provider_key, second.provider_key, "a new job gets a new provider key");
        assert_eq!((first.cap, first.severity), (3, Severity::Critical));
        assert_eq!(first.payload, json!({"account": "a1", "period": "2026-11", "credits": 10}));
    }

    #[test]
    fn fingerprint_ignores_key_order_and_sees_values() {
        let a = payload_fingerprint(&json!({"a": 1, "b": [1, {"y": 2, "x": 1}]}));
        let b = payload_fingerprint(&json!({"b": [1, {"x": 1, "y": 2}], "a": 1}));
        assert_eq!(a, b);
        assert_ne!(a, payload_fingerprint(&json!({"a": 2, "b": [1, {"x": 1, "y": 2}]})));
        assert_eq!(
            payload_fingerprint(&json!({"n": 1})),
            hex::encode(Sha256::digest(br#"{"n":1}"#)),
            "the fingerprint is SHA-256 of the canonical JSON"
        );
    }

    #[test]
    fn priorities_outside_the_range_are_refused() {
        let key = IdempotencyKey::builder("k").fact("a", 1).build().unwrap();
        let job = NewJob::new("k", key, json!({})).unwrap();
        assert_eq!(job.priority, 0, "the default");
        for bad in [-101, 101, i16::MIN, i16::MAX] {
            let err = job.clone().with_priority(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        }
        for good in [-100, -1, 0, 1, 100] {
            assert_eq!(job.clone().with_priority(good).unwrap().priority, good);
        }
        let refusing = crate::kit::Capabilities { priorities: false, ..Default::default() };
        assert!(job.clone().with_priority(0).unwrap().check_fits(&refusing).is_ok(), "0 fits anywhere");
        let err = job.clone().with_priority(5).unwrap().check_fits(&refusing).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("a queue per priority"), "{err}");
        let keeping = crate::kit::Capabilities { priorities: true, ..Default::default() };
        assert!(job.clone().with_priority(5).unwrap().check_fits(&keeping).is_ok());
        let set_by_hand = NewJob { priority: 300, ..job };
        assert_eq!(set_by_hand.check_fits(&keeping).unwrap_err().kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn a_traceparent_is_refused_unless_it_is_a_w3c_trace_context() {
        let key = IdempotencyKey::builder("k").fact("a", 1).build().unwrap();
        let job = NewJob::new("k", key, json!({})).unwrap();
        assert_eq!(job.traceparent, None, "no span, no context");
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = job.clone().with_traceparent(good).unwrap();
        assert_eq!(traced.traceparent.as_deref(), Some(good));
        assert!(traced.check_fits(&crate::kit::Capabilities::default()).is_ok());
        for bad in [
            "",
            "not a traceparent",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            let err = job.clone().with_traceparent(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
            assert!(err.to_string().contains("not a W3C trace context"), "{err}");
            // Set by hand, the field is refused at enqueue all the same.
            let by_hand = NewJob { traceparent: Some(bad.to_owned()), ..job.clone() };
            let err = by_hand.check_fits(&crate::kit::Capabilities::default()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn a_job_record_reads_its_trace_id() {
        let key = IdempotencyKey::builder("k").fact("a", 1).build().unwrap();
        let new = NewJob::new("k", key, json!({})).unwrap();
        let mut job = crate::kit::Envelope::new(&new).into_job(JobId("1".into()), 1, None);
        assert_eq!(job.trace_id(), None);
        job.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        assert_eq!(job.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        job.traceparent = Some("garbage".into());
        assert_eq!(job.trace_id(), None, "an invalid one has none");
    }

    #[test]
    fn oversized_payloads_are_refused() {
        let key = IdempotencyKey::builder("k").fact("a", 1).build().unwrap();
        let job = NewJob::new("k", key, json!({"blob": "x".repeat(100)})).unwrap();
        assert_eq!(job.check_size(50).unwrap_err().kind(), ErrorKind::PayloadTooLarge);
        assert!(job.check_size(200).is_ok());
    }

    #[test]
    fn any_error_converts_to_a_retry() {
        fn fails() -> Result<(), JobError> {
            Err(std::io::Error::other("smtp down"))?
        }
        let err = fails().unwrap_err();
        assert_eq!(err.retrying(), Retrying::Backoff);
        assert_eq!(JobError::permanent("bad address").retrying(), Retrying::Never);
        let throttled = JobError::retry_after(Duration::from_secs(42), "429");
        assert_eq!(throttled.retrying(), Retrying::After(Duration::from_secs(42)));
        let later = JobError::not_now(Duration::from_secs(60), "maintenance until 03:00");
        assert_eq!(later.retrying(), Retrying::NotNow(Duration::from_secs(60)));
    }
}

debug_redacted!(NewJob {
    show: [kind, key, provider_key, cap, severity, deadline, not_before, order_key, priority, replay_of, traceparent],
    hide: [payload]
});
debug_redacted!(JobRecord {
    show: [
        id,
        kind,
        key,
        provider_key,
        attempt,
        cap,
        severity,
        priority,
        enqueued_at,
        deadline,
        not_before,
        stranded,
        undecodable,
        replay_of,
        traceparent
    ],
    hide: [payload],
});
