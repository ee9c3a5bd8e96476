//! The delivery engine: each message's signed HTTP attempts with QStash's backoff and
//! `Retry-After`, queues' ordered starts, and the move to the DLQ after the last retry.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::Notify;

use super::model::{FlowSpec, canonical};
use super::{DlqEntry, FlowState, Message, Shared};
use crate::Delivery;
use crate::util::{self, Expr};

impl Shared {
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

    fn record_delivery(&self, d: Delivery) {
        self.lock().deliveries.push(d);
        self.changed.notify_waiters();
    }
}

/// Starts a queue's messages in order, at most `parallelism` at once.
pub(super) async fn queue_worker(shared: Arc<Shared>, name: String) {
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
        // Held for the attempt: the key's in-flight count drops when it ends, however it ends,
        // and before a retry's wait (QStash counts calls in flight, not messages waiting).
        let slot = match &first.flow {
            Some(flow) => match take_flow_slot(&shared, &first.cancel, flow).await {
                Some(slot) => Some(slot),
                None => return,
            },
            None => None,
        };
        let (msg, key) = {
            let mut inner = shared.lock();
            let Some(msg) = inner.messages.get(&id).cloned() else { return };
            Shared::event(&mut inner, &msg, "ACTIVE", json!({}));
            (msg, inner.keys.current.clone())
        };
        let signature = util::sign(&key, &msg.url, &msg.body);
        let outcome = attempt(&shared, &msg, &signature).await;
        drop(slot);
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

/// A delivery's hold on its flow-control key: one of the key's in-flight deliveries until dropped.
struct FlowSlot {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for FlowSlot {
    fn drop(&mut self) {
        let mut inner = self.shared.lock();
        if let Some(state) = inner.flows.get_mut(&self.key) {
            state.in_flight = state.in_flight.saturating_sub(1);
            state.released.notify_waiters();
        }
    }
}

/// Waits until `flow`'s limits let one more delivery of its key start, and takes its place: at
/// most `parallelism` of the key in flight, at most `rate` of the key started in the current
/// fixed window of `period` (a window opens with the first start after the last one closed).
/// Waiting costs no retry. `None` when the message is cancelled or the emulator stops meanwhile.
async fn take_flow_slot(shared: &Arc<Shared>, cancel: &Notify, flow: &FlowSpec) -> Option<FlowSlot> {
    let mut shutdown = shared.shutdown.clone();
    let mut counted = false;
    let waited = |shared: &Shared, counted: bool| {
        if counted && let Some(state) = shared.lock().flows.get_mut(&flow.key) {
            state.waiting = state.waiting.saturating_sub(1);
        }
    };
    loop {
        let released = shared.lock().flows.entry(flow.key.clone()).or_insert_with(FlowState::new).released.clone();
        let notified = released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wait = {
            let mut inner = shared.lock();
            let state = inner.flows.entry(flow.key.clone()).or_insert_with(FlowState::new);
            let now = Instant::now();
            let window = match state.window {
                Some((start, per, n)) if now < start + per => (start, per, n),
                _ => (now, flow.period, 0),
            };
            let busy = flow.parallelism.is_some_and(|p| state.in_flight >= p);
            let spent = flow.rate.is_some_and(|r| window.2 >= r);
            if !busy && !spent {
                state.in_flight += 1;
                if window.2 == 0 {
                    state.window_start_unix = util::now_secs();
                }
                state.window = Some((window.0, window.1, window.2 + 1));
                if counted {
                    state.waiting = state.waiting.saturating_sub(1);
                }
                return Some(FlowSlot { shared: shared.clone(), key: flow.key.clone() });
            }
            if !counted {
                state.waiting += 1;
                counted = true;
            }
            // Held by the rate: until the window closes (or a release, for a parallelism wait).
            spent.then(|| (window.0 + window.1).saturating_duration_since(now))
        };
        let sleep = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600)));
        tokio::select! {
            _ = &mut notified => {}
            _ = sleep => {}
            _ = cancel.notified() => {
                waited(shared, counted);
                return None;
            }
            _ = shutdown.wait_for(|s| *s) => {
                waited(shared, counted);
                return None;
            }
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
