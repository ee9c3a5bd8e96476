//! The emulator's state and its delivery engine: messages, queues, retries, the DLQ, the log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, watch};

use crate::util::{self, Expr};
use crate::{Delivery, RateLimit, SigningKeys};

/// How many log events are kept, as QStash does.
pub(crate) const MAX_EVENTS: usize = 10_000;

/// Settings fixed by the emulator's builder.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) time_scale: f64,
    pub(crate) dedupe_window: Duration,
    pub(crate) max_retries: u32,
    pub(crate) quota: Option<u64>,
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) default_timeout: Duration,
}

/// What a publish request (or a DLQ retry's override headers) asks for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spec {
    pub(crate) retries: Option<u32>,
    pub(crate) delay: Option<Duration>,
    pub(crate) not_before: Option<u64>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) dedupe_id: Option<String>,
    pub(crate) content_dedupe: bool,
    pub(crate) method: Option<String>,
    pub(crate) forward: Vec<(String, String)>,
    pub(crate) content_type: Option<String>,
    pub(crate) retry_delay: Option<String>,
    pub(crate) callback: Option<String>,
    pub(crate) failure_callback: Option<String>,
    pub(crate) label: Option<String>,
}

impl Spec {
    /// Reads the `Upstash-*` configuration headers, `Upstash-Forward-*` and `Content-Type`.
    pub(crate) fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Spec, String> {
        let mut spec = Spec::default();
        for (name, value) in headers {
            let lower = name.to_ascii_lowercase();
            let value = value.trim();
            if let Some(stripped) = lower.strip_prefix("upstash-forward-") {
                // Canonical spelling, as QStash (Go's net/http) shows header names.
                spec.forward.push((canonical(stripped), value.to_owned()));
                continue;
            }
            match lower.as_str() {
                "content-type" => spec.content_type = Some(value.to_owned()),
                "upstash-retries" => {
                    spec.retries = Some(value.parse().map_err(|_| format!("invalid Upstash-Retries: {value:?}"))?)
                }
                "upstash-delay" => {
                    spec.delay = Some(util::parse_duration(value).ok_or(format!("invalid Upstash-Delay: {value:?}"))?)
                }
                "upstash-not-before" => {
                    spec.not_before = Some(value.parse().map_err(|_| format!("invalid Upstash-Not-Before: {value:?}"))?)
                }
                "upstash-timeout" => {
                    spec.timeout =
                        Some(util::parse_duration(value).ok_or(format!("invalid Upstash-Timeout: {value:?}"))?)
                }
                "upstash-deduplication-id" => spec.dedupe_id = Some(value.to_owned()),
                "upstash-content-based-deduplication" => spec.content_dedupe = value.eq_ignore_ascii_case("true"),
                "upstash-method" => {
                    let m = value.to_ascii_uppercase();
                    if !["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"].contains(&m.as_str()) {
                        return Err(format!("invalid Upstash-Method: {value:?}"));
                    }
                    spec.method = Some(m);
                }
                "upstash-retry-delay" => {
                    Expr::parse(value).map_err(|e| format!("invalid Upstash-Retry-Delay: {e}"))?;
                    spec.retry_delay = Some(value.to_owned());
                }
                "upstash-callback" => spec.callback = Some(value.to_owned()),
                "upstash-failure-callback" => spec.failure_callback = Some(value.to_owned()),
                "upstash-label" => spec.label = Some(value.to_owned()),
                _ => {}
            }
        }
        Ok(spec)
    }
}

/// A message waiting for (or in) delivery.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub(crate) id: String,
    pub(crate) url: String,
    pub(crate) method: String,
    /// Headers sent to the destination: the forwarded ones (prefix stripped) and Content-Type.
    pub(crate) header: Vec<(String, String)>,
    pub(crate) body: Bytes,
    pub(crate) max_retries: u32,
    pub(crate) retried: u32,
    pub(crate) timeout: Duration,
    pub(crate) retry_delay: Option<String>,
    pub(crate) callback: Option<String>,
    pub(crate) failure_callback: Option<String>,
    pub(crate) label: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) caller_ip: Option<String>,
    pub(crate) created_at: u64,
    pub(crate) not_before: u64,
    /// What the message was published with for deduplication: a DLQ retry keeps it.
    pub(crate) dedupe_id: Option<String>,
    pub(crate) content_dedupe: bool,
    pub(crate) cancel: Arc<Notify>,
}

impl Message {
    fn header_json(&self) -> Value {
        let mut map: Map<String, Value> = Map::new();
        for (k, v) in &self.header {
            let entry = map.entry(k.clone()).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = entry {
                a.push(Value::String(v.clone()));
            }
        }
        Value::Object(map)
    }

    /// The message in the shape of `GET /v2/messages/{id}`.
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("messageId".into(), json!(self.id));
        m.insert("url".into(), json!(self.url));
        m.insert("method".into(), json!(self.method));
        m.insert("header".into(), self.header_json());
        let (body, body_b64) = util::utf8_or_base64(&self.body);
        if let Some(b) = body {
            m.insert("body".into(), json!(b));
        }
        if let Some(b) = body_b64 {
            m.insert("bodyBase64".into(), json!(b));
        }
        m.insert("maxRetries".into(), json!(self.max_retries));
        m.insert("retried".into(), json!(self.retried));
        m.insert("notBefore".into(), json!(self.not_before));
        m.insert("createdAt".into(), json!(self.created_at));
        m.insert("timeout".into(), json!(self.timeout.as_secs()));
        for (k, v) in [
            ("queueName", &self.queue),
            ("callback", &self.callback),
            ("failureCallback", &self.failure_callback),
            ("retryDelayExpression", &self.retry_delay),
            ("label", &self.label),
            ("callerIP", &self.caller_ip),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), json!(v));
            }
        }
        Value::Object(m)
    }
}

/// A message in the dead-letter queue, with the last failed response.
#[derive(Debug, Clone)]
pub(crate) struct DlqEntry {
    pub(crate) dlq_id: String,
    pub(crate) message: Message,
    pub(crate) response_status: u16,
    pub(crate) response_header: Vec<(String, String)>,
    pub(crate) response_body: Bytes,
    pub(crate) error: Option<String>,
}

impl DlqEntry {
    pub(crate) fn to_json(&self) -> Value {
        let mut v = self.message.to_json();
        let m = v.as_object_mut().expect("an object");
        m.insert("dlqId".into(), json!(self.dlq_id));
        m.insert("responseStatus".into(), json!(self.response_status));
        let mut rh: Map<String, Value> = Map::new();
        for (k, val) in &self.response_header {
            if let Value::Array(a) = rh.entry(k.clone()).or_insert_with(|| Value::Array(Vec::new())) {
                a.push(json!(val));
            }
        }
        m.insert("responseHeader".into(), Value::Object(rh));
        let (body, body_b64) = util::utf8_or_base64(&self.response_body);
        if let Some(b) = body {
            m.insert("responseBody".into(), json!(b));
        }
        if let Some(b) = body_b64 {
            m.insert("responseBodyBase64".into(), json!(b));
        }
        if let Some(e) = &self.error {
            m.insert("error".into(), json!(e));
        }
        v
    }
}

/// A named queue: deliveries in order, at most `parallelism` at once.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) parallelism: u32,
    pub(crate) paused: bool,
    pub(crate) pending: VecDeque<String>,
    pub(crate) in_flight: u32,
    pub(crate) notify: Arc<Notify>,
    pub(crate) created_at: u64,
    pub(crate) updated_at: u64,
}

impl Queue {
    pub(crate) fn to_json(&self, name: &str) -> Value {
        json!({
            "name": name,
            "parallelism": self.parallelism,
            "paused": self.paused,
            "lag": self.pending.len() as u64 + u64::from(self.in_flight),
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        })
    }
}

/// One line of the events log.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) seq: u64,
    pub(crate) time: u64,
    pub(crate) state: &'static str,
    pub(crate) message_id: String,
    pub(crate) url: String,
    pub(crate) queue: Option<String>,
    pub(crate) json: Value,
}

/// Mutable state behind one lock (never held across an await).
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) keys: SigningKeys,
    pub(crate) messages: HashMap<String, Message>,
    pub(crate) dlq: BTreeMap<u64, DlqEntry>,
    pub(crate) dlq_index: HashMap<String, u64>,
    pub(crate) dlq_seq: u64,
    pub(crate) events: VecDeque<Event>,
    pub(crate) event_seq: u64,
    pub(crate) dedupe: HashMap<String, (String, Instant)>,
    pub(crate) queues: HashMap<String, Queue>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) accepted: u64,
    pub(crate) rate_window: Option<(Instant, u32)>,
}

/// Everything the handlers and the delivery tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) token: String,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) http: reqwest::Client,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) publish_requests: AtomicU64,
    pub(crate) changed: Notify,
}

/// The outcome of accepting a message.
pub(crate) struct Accepted {
    pub(crate) message_id: String,
    pub(crate) deduplicated: bool,
}

impl Accepted {
    pub(crate) fn to_json(&self) -> Value {
        if self.deduplicated {
            json!({"messageId": self.message_id, "deduplicated": true})
        } else {
            json!({"messageId": self.message_id})
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count_publish_request(&self) {
        self.publish_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends a log event (keeping the last [`MAX_EVENTS`]).
    pub(crate) fn event(inner: &mut Inner, msg: &Message, state: &'static str, extra: Value) {
        inner.event_seq += 1;
        let time = util::now_ms();
        let mut v = json!({
            "time": time,
            "state": state,
            "messageId": msg.id,
            "url": msg.url,
            "method": msg.method,
            "header": msg.header_json(),
            "body": util::base64(&msg.body),
            "maxRetries": msg.max_retries,
            "timeout": msg.timeout.as_secs(),
        });
        let m = v.as_object_mut().expect("an object");
        if let Some(q) = &msg.queue {
            m.insert("queueName".into(), json!(q));
        }
        if let Some(l) = &msg.label {
            m.insert("label".into(), json!(l));
        }
        if let Some(expr) = &msg.retry_delay {
            m.insert("retryDelayExpr".into(), json!(expr));
        }
        if let Value::Object(extra) = extra {
            m.extend(extra);
        }
        inner.events.push_back(Event {
            seq: inner.event_seq,
            time,
            state,
            message_id: msg.id.clone(),
            url: msg.url.clone(),
            queue: msg.queue.clone(),
            json: v,
        });
        while inner.events.len() > MAX_EVENTS {
            inner.events.pop_front();
        }
    }

    /// Checks the burst rate limit; `Err(reset_unix_secs)` when exceeded.
    pub(crate) fn check_rate(&self) -> Result<(), (RateLimit, u64)> {
        let Some(limit) = self.config.rate_limit else { return Ok(()) };
        let mut inner = self.lock();
        let now = Instant::now();
        let window = match inner.rate_window {
            Some((start, n)) if now.duration_since(start) < limit.period => (start, n),
            _ => (now, 0),
        };
        if window.1 >= limit.limit {
            let left = limit.period.saturating_sub(now.duration_since(window.0));
            inner.rate_window = Some(window);
            return Err((limit, util::now_secs() + left.as_secs().max(1)));
        }
        inner.rate_window = Some((window.0, window.1 + 1));
        Ok(())
    }

    /// Whether `n` more messages fit in the quota.
    pub(crate) fn quota_allows(&self, n: u64) -> bool {
        match self.config.quota {
            None => true,
            Some(q) => self.lock().accepted + n <= q,
        }
    }

    /// Accepts a message: dedupes it, stores it, logs CREATED and schedules its delivery.
    pub(crate) fn accept(
        self: &Arc<Self>,
        url: String,
        queue: Option<String>,
        spec: Spec,
        body: Bytes,
        caller_ip: Option<String>,
    ) -> Accepted {
        let now = Instant::now();
        let dedupe_key = if let Some(id) = &spec.dedupe_id {
            Some(format!("id:{id}"))
        } else if spec.content_dedupe {
            let mut headers: Vec<String> =
                spec.forward.iter().map(|(k, v)| format!("{}:{v}", k.to_lowercase())).collect();
            headers.sort();
            let joined = headers.join("\n");
            Some(format!(
                "content:{}",
                util::content_hash(&[
                    url.as_bytes(),
                    queue.as_deref().unwrap_or("").as_bytes(),
                    joined.as_bytes(),
                    spec.content_type.as_deref().unwrap_or("").as_bytes(),
                    &body
                ])
            ))
        } else {
            None
        };
        let mut inner = self.lock();
        inner.dedupe.retain(|_, (_, until)| *until > now);
        if let Some(key) = &dedupe_key
            && let Some((first, _)) = inner.dedupe.get(key)
        {
            return Accepted { message_id: first.clone(), deduplicated: true };
        }
        let created_at = util::now_ms();
        let not_before = match (spec.not_before, spec.delay) {
            (Some(secs), _) => secs * 1000,
            (None, Some(d)) => created_at + d.as_millis() as u64,
            (None, None) => 0,
        };
        let mut header = Vec::new();
        if let Some(ct) = &spec.content_type {
            header.push(("Content-Type".to_owned(), ct.clone()));
        }
        header.extend(spec.forward.iter().cloned());
        let msg = Message {
            id: util::random_id("msg_", 26),
            url,
            method: spec.method.clone().unwrap_or_else(|| "POST".to_owned()),
            header,
            body,
            max_retries: spec.retries.unwrap_or(self.config.max_retries),
            retried: 0,
            timeout: spec.timeout.unwrap_or(self.config.default_timeout),
            retry_delay: spec.retry_delay.clone(),
            callback: spec.callback.clone(),
            failure_callback: spec.failure_callback.clone(),
            label: spec.label.clone(),
            queue: queue.clone(),
            caller_ip,
            created_at,
            not_before,
            dedupe_id: spec.dedupe_id.clone(),
            content_dedupe: spec.content_dedupe,
            cancel: Arc::new(Notify::new()),
        };
        if let Some(key) = dedupe_key {
            inner.dedupe.insert(key, (msg.id.clone(), now + self.config.dedupe_window));
        }
        inner.accepted += 1;
        let id = msg.id.clone();
        Self::event(&mut inner, &msg, "CREATED", json!({}));
        inner.messages.insert(id.clone(), msg);
        match queue {
            Some(name) => {
                let spawn_worker = !inner.queues.contains_key(&name);
                let q = inner.queues.entry(name.clone()).or_insert_with(|| new_queue(1, false));
                q.pending.push_back(id.clone());
                q.notify.notify_one();
                drop(inner);
                if spawn_worker {
                    tokio::spawn(queue_worker(self.clone(), name));
                }
            }
            None => {
                drop(inner);
                tokio::spawn(run_message(self.clone(), id.clone()));
            }
        }
        self.changed.notify_waiters();
        Accepted { message_id: id, deduplicated: false }
    }

    /// Creates or updates a queue, starting its worker when new.
    pub(crate) fn upsert_queue(self: &Arc<Self>, name: &str, parallelism: u32, paused: bool) {
        let mut inner = self.lock();
        if let Some(q) = inner.queues.get_mut(name) {
            q.parallelism = parallelism.max(1);
            q.paused = paused;
            q.updated_at = util::now_ms();
            q.notify.notify_one();
            return;
        }
        inner.queues.insert(name.to_owned(), new_queue(parallelism.max(1), paused));
        drop(inner);
        tokio::spawn(queue_worker(self.clone(), name.to_owned()));
    }

    /// Cancels a pending message; false when it is unknown (delivered, failed or never there).
    pub(crate) fn cancel(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let Some(msg) = inner.messages.remove(id) else { return false };
        msg.cancel.notify_one();
        if let Some(q) = msg.queue.as_ref().and_then(|q| inner.queues.get_mut(q)) {
            q.pending.retain(|m| m != id);
        }
        Self::event(&mut inner, &msg, "CANCELED", json!({}));
        true
    }

    /// Moves a failed message to the DLQ.
    fn to_dlq(&self, msg: Message, outcome: &Outcome) {
        let mut inner = self.lock();
        inner.messages.remove(&msg.id);
        inner.dlq_seq += 1;
        let seq = inner.dlq_seq;
        let failed_at = util::now_ms();
        let dlq_id = format!("{failed_at}-{seq}");
        Self::event(
            &mut inner,
            &msg,
            "FAILED",
            json!({"responseStatus": outcome.status.unwrap_or(0), "dlqId": dlq_id}),
        );
        inner.dlq_index.insert(dlq_id.clone(), seq);
        inner.dlq.insert(
            seq,
            DlqEntry {
                dlq_id,
                message: msg,
                response_status: outcome.status.unwrap_or(0),
                response_header: outcome.headers.clone(),
                response_body: outcome.body.clone(),
                error: outcome.error.clone(),
            },
        );
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Removes a DLQ entry.
    pub(crate) fn dlq_remove(&self, dlq_id: &str) -> Option<DlqEntry> {
        let mut inner = self.lock();
        let seq = inner.dlq_index.remove(dlq_id)?;
        inner.dlq.remove(&seq)
    }

    /// Re-sends a DLQ entry as a new message (settings from the entry, overridden by `over`).
    /// The entry leaves the DLQ either way, as QStash's API reference says; the new message keeps
    /// the original's deduplication id (or content-based deduplication) unless `over` gives
    /// another, so a retry within the dedupe window answers `deduplicated` with the earlier
    /// message's id and sends nothing, as QStash's retry answer (`messageId`, `deduplicated`)
    /// allows.
    pub(crate) fn dlq_retry(self: &Arc<Self>, dlq_id: &str, over: &Spec) -> Option<Accepted> {
        let entry = self.dlq_remove(dlq_id)?;
        let m = entry.message;
        let mut forward: Vec<(String, String)> = Vec::new();
        let mut content_type = None;
        for (k, v) in m.header {
            if k.eq_ignore_ascii_case("content-type") {
                content_type = Some(v);
            } else {
                forward.push((k, v));
            }
        }
        for (k, v) in &over.forward {
            forward.retain(|(ek, _)| !ek.eq_ignore_ascii_case(k));
            forward.push((k.clone(), v.clone()));
        }
        let spec = Spec {
            retries: over.retries.or(Some(m.max_retries)),
            delay: over.delay,
            not_before: over.not_before,
            timeout: over.timeout.or(Some(m.timeout)),
            dedupe_id: over.dedupe_id.clone().or(m.dedupe_id),
            content_dedupe: over.content_dedupe || m.content_dedupe,
            method: over.method.clone().or(Some(m.method)),
            forward,
            content_type: over.content_type.clone().or(content_type),
            retry_delay: over.retry_delay.clone().or(m.retry_delay),
            callback: over.callback.clone().or(m.callback),
            failure_callback: over.failure_callback.clone().or(m.failure_callback),
            label: over.label.clone().or(m.label),
        };
        Some(self.accept(m.url, m.queue, spec, m.body, m.caller_ip))
    }

    fn record_delivery(&self, d: Delivery) {
        self.lock().deliveries.push(d);
        self.changed.notify_waiters();
    }
}

fn new_queue(parallelism: u32, paused: bool) -> Queue {
    let now = util::now_ms();
    Queue {
        parallelism,
        paused,
        pending: VecDeque::new(),
        in_flight: 0,
        notify: Arc::new(Notify::new()),
        created_at: now,
        updated_at: now,
    }
}

/// Starts a queue's messages in order, at most `parallelism` at once.
async fn queue_worker(shared: Arc<Shared>, name: String) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let notify = {
            let mut inner = shared.lock();
            let Some(q) = inner.queues.get_mut(&name) else { return };
            let notify = q.notify.clone();
            if !q.paused
                && q.in_flight < q.parallelism
                && let Some(id) = q.pending.pop_front()
            {
                q.in_flight += 1;
                let shared2 = shared.clone();
                let name2 = name.clone();
                tokio::spawn(async move {
                    run_message(shared2.clone(), id).await;
                    let mut inner = shared2.lock();
                    if let Some(q) = inner.queues.get_mut(&name2) {
                        q.in_flight = q.in_flight.saturating_sub(1);
                        q.notify.notify_one();
                    }
                });
                continue;
            }
            notify
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// What one delivery attempt got back.
#[derive(Debug, Default)]
struct Outcome {
    status: Option<u16>,
    headers: Vec<(String, String)>,
    body: Bytes,
    error: Option<String>,
    retry_after: Option<Duration>,
    non_retryable: bool,
}

/// Sleeps `d`; false when the emulator shuts down or the message is cancelled meanwhile.
async fn pause(shared: &Shared, cancel: &Notify, d: Duration) -> bool {
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = cancel.notified() => false,
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

/// Delivers one message until it is delivered, dead-lettered or cancelled.
pub(crate) async fn run_message(shared: Arc<Shared>, id: String) {
    let Some(first) = shared.lock().messages.get(&id).cloned() else { return };
    let wait = first.not_before.saturating_sub(util::now_ms());
    if wait > 0 && !pause(&shared, &first.cancel, Duration::from_millis(wait)).await {
        return;
    }
    loop {
        let (msg, key) = {
            let mut inner = shared.lock();
            let Some(msg) = inner.messages.get(&id).cloned() else { return };
            Shared::event(&mut inner, &msg, "ACTIVE", json!({}));
            (msg, inner.keys.current.clone())
        };
        let signature = util::sign(&key, &msg.url, &msg.body);
        let outcome = attempt(&shared, &msg, &signature).await;
        let delivered = matches!(outcome.status, Some(s) if (200..300).contains(&s));
        tracing::info!(
            message_id = %msg.id,
            url = %msg.url.split('?').next().unwrap_or_default(),
            retried = msg.retried,
            status = outcome.status.unwrap_or(0),
            "delivery attempt"
        );
        shared.record_delivery(Delivery {
            message_id: msg.id.clone(),
            url: msg.url.clone(),
            method: msg.method.clone(),
            retried: msg.retried,
            status: outcome.status,
            error: outcome.error.clone(),
            signature,
            at: SystemTime::now(),
        });
        if delivered {
            let mut inner = shared.lock();
            inner.messages.remove(&id);
            Shared::event(&mut inner, &msg, "DELIVERED", json!({"responseStatus": outcome.status}));
            drop(inner);
            shared.changed.notify_waiters();
            return;
        }
        {
            let mut inner = shared.lock();
            let mut extra = json!({"responseStatus": outcome.status.unwrap_or(0)});
            let (body, _) = util::utf8_or_base64(&outcome.body);
            if let Some(b) = body {
                extra["responseBody"] = json!(b);
            }
            if let Some(e) = &outcome.error {
                extra["error"] = json!(e);
            }
            Shared::event(&mut inner, &msg, "ERROR", extra);
        }
        if outcome.non_retryable || msg.retried >= msg.max_retries {
            shared.to_dlq(msg, &outcome);
            return;
        }
        let delay = outcome.retry_after.unwrap_or_else(|| match msg.retry_delay.as_deref().map(Expr::parse) {
            Some(Ok(e)) => {
                let ms = e.eval(f64::from(msg.retried));
                Duration::from_secs_f64((ms.max(0.0) / 1000.0).min(86400.0))
            }
            _ => util::default_backoff(msg.retried + 1).mul_f64(shared.config.time_scale.max(0.0)),
        });
        {
            let mut inner = shared.lock();
            let Some(m) = inner.messages.get_mut(&id) else { return };
            m.retried += 1;
            let m = m.clone();
            let next = util::now_ms() + delay.as_millis() as u64;
            Shared::event(&mut inner, &m, "RETRY", json!({"nextDeliveryTime": next}));
        }
        if !pause(&shared, &msg.cancel, delay).await {
            return;
        }
    }
}

/// One HTTP delivery attempt.
async fn attempt(shared: &Shared, msg: &Message, signature: &str) -> Outcome {
    let method = reqwest::Method::from_bytes(msg.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let mut req = shared.http.request(method, &msg.url).timeout(msg.timeout);
    for (k, v) in &msg.header {
        req = req.header(k.as_str(), v.as_str());
    }
    req = req
        .header("Upstash-Message-Id", msg.id.as_str())
        .header("Upstash-Retried", msg.retried.to_string())
        .header("Upstash-Signature", signature)
        .header("User-Agent", "Upstash-QStash");
    if let Some(ip) = &msg.caller_ip {
        req = req.header("Upstash-Caller-Ip", ip.as_str());
    }
    if let Some(q) = &msg.queue {
        req = req.header("Upstash-Queue-Name", q.as_str());
    }
    if !msg.body.is_empty() {
        req = req.body(msg.body.clone());
    }
    match req.send().await {
        Err(e) => Outcome {
            error: Some(if e.is_timeout() {
                format!("timed out after {:?}", msg.timeout)
            } else {
                format!("delivery failed: {}", error_chain(&e))
            }),
            ..Outcome::default()
        },
        Ok(resp) => {
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let non_retryable = status == 489
                && headers
                    .get("upstash-nonretryable-error")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
            let retry_after = util::retry_after(&headers);
            let body = match tokio::time::timeout(msg.timeout, resp.bytes()).await {
                Ok(Ok(b)) => b,
                _ => Bytes::new(),
            };
            Outcome {
                status: Some(status),
                headers: headers
                    .iter()
                    .filter_map(|(k, v)| v.to_str().ok().map(|v| (canonical(k.as_str()), v.to_owned())))
                    .collect(),
                body,
                error: None,
                retry_after,
                non_retryable,
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// `content-type` → `Content-Type`.
pub(crate) fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}
