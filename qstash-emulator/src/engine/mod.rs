//! The emulator's state and its delivery engine: messages, queues, retries, the DLQ, the log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::util;
use crate::{Delivery, RateLimit, SigningKeys};

mod delivery;
mod model;

use self::delivery::{queue_worker, run_message};
use self::model::new_queue;
pub(crate) use self::model::{DlqEntry, Event, FlowState, Message, Queue, Spec};

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
    /// Flow-control keys by name, kept once seen (as QStash lists them).
    pub(crate) flows: HashMap<String, FlowState>,
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
        if let Some(flow) = &msg.flow {
            flow.add_json(m);
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
            flow: spec.flow.clone(),
            cancel: Arc::new(Notify::new()),
        };
        if let Some(flow) = &spec.flow {
            inner.flows.entry(flow.key.clone()).or_insert_with(FlowState::new).latest = Some(flow.clone());
        }
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
            flow: over.flow.clone().or(m.flow),
        };
        Some(self.accept(m.url, m.queue, spec, m.body, m.caller_ip))
    }
}
