//! QStash's DLQ entries as failure records, and the headers a copy carries between deliveries.
//!
//! A copy (a retry, a deferral or an unclaimed delivery handed back, published by the backend)
//! forwards these headers, which QStash delivers without their `Upstash-Forward-` prefix and
//! keeps in a DLQ entry's `header`:
//!
//! | header | value |
//! |---|---|
//! | `Redrive-Job-Id` | the job's id: its first message's id |
//! | `Redrive-Spent` | attempts the job spent before this copy |
//! | `Redrive-Errors` | the failed attempts so far, JSON as in `docs/envelope.md`, base64url |
//! | `Redrive-Unclaimed` | rounds in a row handed back unclaimed by a process with no worker for the kind |
//! | `Redrive-Seal` | HMAC-SHA256 of the four above and the body's SHA-256, keyed from the QStash token, base64url |
//! | `Redrive-Copied-At` | when the copy was published, unix milliseconds (for a person reading the DLQ) |
//!
//! QStash's signature covers the body only: the headers of a delivery are whatever its sender
//! wrote. The receiver takes the carried values from a delivery only under a seal that holds, so
//! a delivery sent by someone else cannot claim a later attempt, another job's id or a made-up
//! history; without one it is the job's first message. A DLQ entry is read through the API with
//! the token, so its headers are taken as they are.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chrono::{DateTime, TimeZone, Utc};
use hmac::{KeyInit, Mac};
use redrive_core::kit::AttemptError;
use redrive_core::kit::broker::{Known, carried_job};
use redrive_core::{FailureId, FailureRecord, JobId};
use sha2::{Digest, Sha256};

use crate::api::DlqEntry;

pub(crate) const JOB_ID: &str = "Redrive-Job-Id";
pub(crate) const SPENT: &str = "Redrive-Spent";
pub(crate) const ERRORS: &str = "Redrive-Errors";
pub(crate) const COPIED_AT: &str = "Redrive-Copied-At";
pub(crate) const UNCLAIMED: &str = "Redrive-Unclaimed";
pub(crate) const SEAL: &str = "Redrive-Seal";
/// The failure record a replayed job replays (a DLQ retry resends the entry's body as it was, so
/// the record's id travels beside it).
pub(crate) const REPLAY_OF: &str = "Redrive-Replay-Of";
/// On the worker's 489: when the record was written, unix milliseconds (kept in the entry's
/// `responseHeader`).
pub(crate) const FAILED_AT: &str = "Redrive-Failed-At";
/// On the worker's 489: the trace id of the failing attempt (kept in the entry's
/// `responseHeader`), which the record keeps rather than the one of the body's `traceparent`.
pub(crate) const TRACE_ID: &str = "Redrive-Trace-Id";

/// What a message carries beside its body, read from a delivery's headers or a DLQ entry's.
#[derive(Debug, Default, Clone)]
pub(crate) struct Carried {
    pub(crate) job_id: Option<String>,
    pub(crate) spent: u32,
    pub(crate) errors: Vec<AttemptError>,
    pub(crate) unclaimed: u32,
    pub(crate) replay_of: Option<String>,
}

impl Carried {
    /// Reads the carried headers through `get`, which looks a name up case-insensitively.
    pub(crate) fn read(get: impl Fn(&str) -> Option<String>) -> Self {
        let one = |name: &str| get(name).or_else(|| get(&format!("Upstash-Forward-{name}")));
        Self {
            job_id: one(JOB_ID).filter(|id| !id.is_empty()),
            spent: one(SPENT).and_then(|s| s.trim().parse().ok()).unwrap_or(0),
            errors: one(ERRORS).and_then(|e| decode_errors(&e)).unwrap_or_default(),
            unclaimed: one(UNCLAIMED).and_then(|s| s.trim().parse().ok()).unwrap_or(0),
            replay_of: one(REPLAY_OF).filter(|id| !id.is_empty()),
        }
    }

    /// The carried headers of a delivery of `body`, if `seal` sealed them; else nothing carried
    /// (the job's first message), and whether headers were there unsealed.
    pub(crate) fn sealed(get: impl Fn(&str) -> Option<String>, seal: &Seal, body: &[u8]) -> (Self, bool) {
        let raw = |name: &str| get(name).unwrap_or_default();
        let values = [raw(JOB_ID), raw(SPENT), raw(ERRORS), raw(UNCLAIMED), raw(REPLAY_OF)];
        let given = get(SEAL);
        match given {
            Some(given) if seal.holds(&values, body, &given) => (Self::read(get), false),
            _ => (Self::default(), values.iter().any(|v| !v.is_empty())),
        }
    }
}

/// Seals a copy's carried headers to its body, with a key only holders of the QStash token have.
pub(crate) struct Seal {
    key: [u8; 32],
}

impl Seal {
    pub(crate) fn new(token: &str) -> Self {
        Self { key: Sha256::digest(format!("redrive-qstash-seal\n{token}")).into() }
    }

    fn mac(&self, values: &[String; 5], body: &[u8]) -> hmac::Hmac<Sha256> {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        let [first @ .., replay_of] = values;
        for value in first {
            mac.update(value.as_bytes());
            mac.update(b"\n");
        }
        // Sealed only when there is one, so that copies sealed before it was carried still hold.
        if !replay_of.is_empty() {
            mac.update(replay_of.as_bytes());
            mac.update(b"\n");
        }
        mac.update(&Sha256::digest(body));
        mac
    }

    /// The seal of the carried `values` (job id, spent, errors, unclaimed, replay of, as sent) and
    /// `body`.
    pub(crate) fn sign(&self, values: &[String; 5], body: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(values, body).finalize().into_bytes())
    }

    fn holds(&self, values: &[String; 5], body: &[u8], given: &str) -> bool {
        let Ok(given) = URL_SAFE_NO_PAD.decode(given.trim().trim_end_matches('=')) else { return false };
        self.mac(values, body).verify_slice(&given).is_ok()
    }
}

pub(crate) fn encode_errors(errors: &[AttemptError]) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(errors).expect("errors serialize"))
}

fn decode_errors(text: &str) -> Option<Vec<AttemptError>> {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(text.trim().trim_end_matches('=')).ok()?).ok()
}

fn millis(text: &str) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(text.trim().parse().ok()?).single()
}

pub(crate) fn lookup(map: &Option<HashMap<String, Vec<String>>>, name: &str) -> Option<String> {
    map.as_ref()?.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.first().cloned())
}

pub(crate) fn text(plain: &Option<String>, base64: &Option<String>) -> String {
    match (plain, base64) {
        (Some(text), _) if !text.is_empty() => text.clone(),
        (_, Some(encoded)) => {
            STANDARD.decode(encoded).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
        }
        _ => String::new(),
    }
}

/// The failure record a DLQ entry stands for: the job its body carries, the attempts its copies
/// and QStash's retries spent, the history its headers carried, and as the last error the
/// worker's (the body of its 489) or, where QStash gave up on its own, the endpoint's last answer.
pub(crate) fn record_of(entry: &DlqEntry) -> FailureRecord {
    let carried = Carried::read(|name| lookup(&entry.header, name));
    let body = text(&entry.body, &entry.body_base64);
    let created = entry.created_at.and_then(|ms| Utc.timestamp_millis_opt(ms).single()).unwrap_or_else(Utc::now);
    let (env, undecodable) = carried_job("qstash", &entry.message_id, &body, Known::default(), created);
    let attempts = carried.spent + entry.retried.unwrap_or(0) + 1;
    // A message QStash moved on its own says nothing of when: the drain that first lists it
    // keeps that moment (records are kept once), rather than the copy's publish time.
    let failed_at = lookup(&entry.response_header, FAILED_AT).and_then(|ms| millis(&ms)).unwrap_or_else(Utc::now);
    let answer = text(&entry.response_body, &entry.response_body_base64);
    let error = match (undecodable, entry.response_status) {
        (Some(why), _) => why,
        (None, Some(489)) if !answer.is_empty() => answer,
        (None, Some(status)) => format!(
            "QStash gave up after {attempts} attempts; the endpoint last answered {status}: {}",
            redrive_core::kit::broker::cut(&answer, 512)
        ),
        (None, None) => format!("QStash gave up after {attempts} attempts without an answer from the endpoint"),
    };
    let mut job = env.into_job(JobId(carried.job_id.unwrap_or_else(|| entry.message_id.clone())), attempts, None);
    job.replay_of = job.replay_of.or(carried.replay_of.map(FailureId));
    let mut record = FailureRecord::from_job(FailureId(entry.dlq_id.clone()), &job, &error, carried.errors, failed_at);
    // The worker's 489 named the failing attempt's trace; without one (QStash gave up on its own),
    // the record keeps the trace of the job's traceparent.
    if let Some(id) = lookup(&entry.response_header, TRACE_ID).filter(|id| is_trace_id(id)) {
        record.trace_id = Some(id);
    }
    record
}

/// 32 lower-case hex digits, not all zero: a W3C trace id.
fn is_trace_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && id.bytes().any(|b| b != b'0')
}

#[cfg(test)]
mod tests {
    use redrive_core::kit::Envelope;
    use redrive_core::{IdempotencyKey, NewJob};

    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn entry(response_header: serde_json::Value) -> DlqEntry {
        let key = IdempotencyKey::builder("ship").fact("parcel", 1).build().unwrap();
        let job = NewJob::new("ship", key, serde_json::json!({})).unwrap().with_traceparent(TRACEPARENT).unwrap();
        serde_json::from_value(serde_json::json!({
            "dlqId": "d-1", "messageId": "m-1", "body": Envelope::new(&job).encode(),
            "responseStatus": 489, "responseBody": "boom", "responseHeader": response_header,
        }))
        .unwrap()
    }

    #[test]
    fn a_record_keeps_the_trace_the_worker_named_else_the_bodys() {
        // The failing attempt's trace, from the worker's 489 (a retry's own trace).
        let named = entry(serde_json::json!({ TRACE_ID: ["0af7651916cd43dd8448eb211c80319c"] }));
        assert_eq!(record_of(&named).trace_id.as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
        // None named (QStash gave up on its own), or not a trace id: the body's traceparent's.
        for header in [serde_json::json!({}), serde_json::json!({ TRACE_ID: ["not-a-trace"] })] {
            assert_eq!(record_of(&entry(header)).trace_id.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        }
    }
}
