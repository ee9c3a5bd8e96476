//! What the emulator keeps: messages, DLQ entries, queues, log events, and what a publish asks
//! for, each with the JSON QStash's API answers with.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::util::{self, Expr};

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
    /// `Upstash-Flow-Control-Key` with `Upstash-Flow-Control-Value`.
    pub(crate) flow: Option<FlowSpec>,
}

/// A message's flow control: the key it counts under and the limits it was published with
/// (`Upstash-Flow-Control-Key`, `Upstash-Flow-Control-Value: parallelism=2, rate=10, period=1m`).
/// Each message keeps its own limits, as QStash documents: while messages with older and newer
/// limits of one key wait together, each is held to its own, so the highest is what passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlowSpec {
    pub(crate) key: String,
    /// At most this many of the key's deliveries in flight at once.
    pub(crate) parallelism: Option<u32>,
    /// At most this many of the key's deliveries started per `period`.
    pub(crate) rate: Option<u32>,
    /// The rate's window: whole seconds, 1 s (the default) to 7 days.
    pub(crate) period: Duration,
}

/// The longest rate period: a week, as the PyPI client's `FlowControl.period` documents.
const MAX_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);

impl FlowSpec {
    /// Reads the two headers; both or neither must be given.
    fn parse(key: Option<&str>, value: Option<&str>) -> Result<Option<FlowSpec>, String> {
        let (key, value) = match (key, value) {
            (None, None) => return Ok(None),
            (Some(key), Some(value)) => (key.trim(), value),
            (Some(_), None) => return Err("Upstash-Flow-Control-Key needs Upstash-Flow-Control-Value".into()),
            (None, Some(_)) => return Err("Upstash-Flow-Control-Value needs Upstash-Flow-Control-Key".into()),
        };
        if key.is_empty() {
            return Err("invalid Upstash-Flow-Control-Key: empty".into());
        }
        let invalid = |why: &str| format!("invalid Upstash-Flow-Control-Value {value:?}: {why}");
        let mut spec = FlowSpec { key: key.to_owned(), parallelism: None, rate: None, period: Duration::from_secs(1) };
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, v) = part.split_once('=').ok_or_else(|| invalid("expected name=value pairs"))?;
            let (name, v) = (name.trim().to_ascii_lowercase(), v.trim());
            let count = || match v.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(invalid(&format!("{name} must be a whole number of 1 or more"))),
            };
            match name.as_str() {
                "parallelism" => spec.parallelism = Some(count()?),
                "rate" | "ratepersecond" => spec.rate = Some(count()?),
                "period" => {
                    // A bare number is seconds, as the clients' numeric `period` means.
                    let period = match v.parse::<u64>() {
                        Ok(secs) => Some(Duration::from_secs(secs)),
                        Err(_) => util::parse_duration(v),
                    };
                    spec.period = match period {
                        Some(p) if p.subsec_nanos() == 0 && p >= Duration::from_secs(1) && p <= MAX_PERIOD => p,
                        _ => return Err(invalid("period must be whole seconds, from 1s to 7d")),
                    };
                }
                _ => return Err(invalid(&format!("unknown parameter {name:?}"))),
            }
        }
        if spec.parallelism.is_none() && spec.rate.is_none() {
            return Err(invalid("give parallelism, rate or both"));
        }
        Ok(Some(spec))
    }
}

impl Spec {
    /// Reads the `Upstash-*` configuration headers, `Upstash-Forward-*` and `Content-Type`.
    pub(crate) fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Spec, String> {
        let mut spec = Spec::default();
        let (mut flow_key, mut flow_value) = (None, None);
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
                "upstash-flow-control-key" => flow_key = Some(value),
                "upstash-flow-control-value" => flow_value = Some(value),
                _ => {}
            }
        }
        spec.flow = FlowSpec::parse(flow_key, flow_value)?;
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
    pub(crate) flow: Option<FlowSpec>,
    pub(crate) cancel: Arc<Notify>,
}

impl Message {
    pub(super) fn header_json(&self) -> Value {
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
        if let Some(flow) = &self.flow {
            flow.add_json(&mut m);
        }
        Value::Object(m)
    }
}

impl FlowSpec {
    /// The fields QStash's message view gives a message's flow control (`period` in seconds).
    pub(crate) fn add_json(&self, m: &mut Map<String, Value>) {
        m.insert("flowControlKey".into(), json!(self.key));
        if let Some(p) = self.parallelism {
            m.insert("parallelism".into(), json!(p));
        }
        if let Some(r) = self.rate {
            m.insert("rate".into(), json!(r));
            m.insert("period".into(), json!(self.period.as_secs()));
        }
    }
}

/// One flow-control key's state: its deliveries in flight, its current rate window, and what
/// the latest message of the key asked for (for `GET /v2/flowControl/{key}`).
#[derive(Debug)]
pub(crate) struct FlowState {
    pub(crate) in_flight: u32,
    /// The current fixed window: when it opened, how long it lasts, how many started in it.
    pub(crate) window: Option<(std::time::Instant, Duration, u32)>,
    /// When the window opened, unix seconds (`ratePeriodStart`).
    pub(crate) window_start_unix: u64,
    /// Messages due but held back by the key's limits.
    pub(crate) waiting: u32,
    pub(crate) latest: Option<FlowSpec>,
    /// Told when a delivery of the key ends.
    pub(crate) released: Arc<Notify>,
}

impl FlowState {
    pub(crate) fn new() -> FlowState {
        FlowState {
            in_flight: 0,
            window: None,
            window_start_unix: 0,
            waiting: 0,
            latest: None,
            released: Arc::new(Notify::new()),
        }
    }

    /// The key as `GET /v2/flowControl/{key}` shows it.
    pub(crate) fn to_json(&self, key: &str) -> Value {
        let now = std::time::Instant::now();
        let rate_count = match self.window {
            Some((start, per, n)) if now < start + per => n,
            _ => 0,
        };
        let mut v = json!({
            "flowControlKey": key,
            "waitListSize": self.waiting,
            "parallelismCount": self.in_flight,
            "rateCount": rate_count,
            "ratePeriodStart": self.window_start_unix,
            "isPaused": false,
            "isPinnedParallelism": false,
            "isPinnedRate": false,
        });
        if let Some(latest) = &self.latest {
            if let Some(p) = latest.parallelism {
                v["parallelismMax"] = json!(p);
            }
            if let Some(r) = latest.rate {
                v["rateMax"] = json!(r);
                v["ratePeriod"] = json!(latest.period.as_secs());
            }
        }
        v
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

pub(super) fn new_queue(parallelism: u32, paused: bool) -> Queue {
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
