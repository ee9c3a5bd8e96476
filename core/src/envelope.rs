//! The versioned JSON envelope that message backends (SQS, Azure, QStash) carry as the body.
//! `docs/envelope.md` describes it for producers in other languages.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::FailureId;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobRecord, NewJob, Severity};
use crate::key::{IdempotencyKey, ProviderKey, check_name};
use crate::redact::debug_redacted;

/// The envelope version this library writes and reads.
pub const ENVELOPE_VERSION: u32 = 1;

/// A job as it travels in a message body.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Always [`ENVELOPE_VERSION`].
    pub v: u32,
    /// The job kind.
    pub kind: String,
    /// The canonical idempotency key.
    pub key: IdempotencyKey,
    /// The provider key (UUID v4).
    pub provider_key: ProviderKey,
    /// The attempt cap.
    pub cap: u32,
    /// The alert severity; `error` when absent.
    #[serde(default)]
    pub severity: Severity,
    /// When the job was first enqueued (RFC 3339, UTC, milliseconds).
    #[serde(serialize_with = "millis")]
    pub enqueued_at: DateTime<Utc>,
    /// When the job becomes worthless: claimed later, it is dropped unrun (RFC 3339, UTC,
    /// milliseconds). Absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "millis_opt")]
    pub deadline: Option<DateTime<Utc>>,
    /// Not to run before this time (RFC 3339, UTC, milliseconds): a worker that receives it
    /// earlier puts it back until then. Absent: at once.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "millis_opt")]
    pub not_before: Option<DateTime<Utc>>,
    /// The failure record this job replays (its id in the queue's record store): set by a
    /// replay, absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<FailureId>,
    /// The producer's trace context, a W3C `traceparent`. Absent: none. One that is not a valid
    /// trace context is dropped at decode (the job runs, untraced), as W3C asks of a receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The job's payload.
    pub payload: Value,
}

impl Envelope {
    /// Wraps a new job, stamped with the current time.
    pub fn new(job: &NewJob) -> Self {
        Self {
            v: ENVELOPE_VERSION,
            kind: job.kind.clone(),
            key: job.key.clone(),
            provider_key: job.provider_key,
            cap: job.cap,
            severity: job.severity,
            enqueued_at: Utc::now(),
            deadline: job.deadline,
            not_before: job.not_before,
            replay_of: job.replay_of.clone(),
            traceparent: job.traceparent.clone(),
            payload: job.payload.clone(),
        }
    }

    /// A claimed job as it travels again (sent on to a dead-letter queue), its first enqueue
    /// time kept.
    pub fn from_job(job: &JobRecord) -> Self {
        Self {
            v: ENVELOPE_VERSION,
            kind: job.kind.clone(),
            key: job.key.clone(),
            provider_key: job.provider_key,
            cap: job.cap,
            severity: job.severity,
            enqueued_at: job.enqueued_at,
            deadline: job.deadline,
            not_before: job.not_before,
            replay_of: job.replay_of.clone(),
            traceparent: job.traceparent.clone(),
            payload: job.payload.clone(),
        }
    }

    /// The job a received message carries, as the worker gets it: this envelope (or a stand-in,
    /// with `undecodable` saying why) under `id`, at `attempt`. Brokers cannot tell a lapsed
    /// claim from a started one, so nothing is counted as stranded.
    pub fn into_job(self, id: JobId, attempt: u32, undecodable: Option<String>) -> JobRecord {
        JobRecord {
            id,
            kind: self.kind,
            key: self.key,
            provider_key: self.provider_key,
            payload: self.payload,
            attempt,
            cap: self.cap,
            severity: self.severity,
            // Refused at enqueue where it would be other (`NewJob::check_fits`).
            priority: 0,
            enqueued_at: self.enqueued_at,
            deadline: self.deadline,
            not_before: self.not_before,
            stranded: 0,
            undecodable,
            replay_of: self.replay_of,
            traceparent: self.traceparent,
        }
    }

    /// The compact JSON body.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("an envelope always serializes")
    }

    /// Reads a body, refusing unknown versions, bad names and bad keys with [`ErrorKind::Decode`].
    /// Unknown fields are ignored, so a newer producer can add some.
    ///
    /// Every error's message starts with "the message body is not a redrive envelope" and names
    /// the field at fault, never a value of the body: it becomes a failure record's last error,
    /// a log line and an alert.
    pub fn decode(body: &[u8]) -> Result<Self> {
        let not_an_envelope =
            |why: &str| Error::new(ErrorKind::Decode, format!("the message body is not a redrive envelope: {why}"));
        let mut envelope: Self = crate::decode::body(body).map_err(|e| not_an_envelope(&e))?;
        if envelope.v != ENVELOPE_VERSION {
            return Err(not_an_envelope(&format!(
                "version {} is not supported (this worker reads version {ENVELOPE_VERSION})",
                envelope.v
            )));
        }
        check_name("job kind", &envelope.kind).map_err(|e| not_an_envelope(e.message()))?;
        // A producer's broken trace context costs the job its trace, not its run.
        envelope.traceparent = envelope.traceparent.filter(|t| crate::trace::invalid(t).is_none());
        Ok(envelope)
    }
}

/// Whole seconds are not enough to order jobs; a fixed precision keeps bodies stable.
fn millis<S: serde::Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true))
}

fn millis_opt<S: serde::Serializer>(at: &Option<DateTime<Utc>>, serializer: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => millis(at, serializer),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_documented_example_decodes() {
        // The example in docs/envelope.md; keep the two in step.
        let body = br#"{"v":1,"kind":"send_receipt","key":"send_receipt:order=42",
            "provider_key":"6f1c1d2e-8c1b-4a57-9a3e-2f0d6c1b7e11","cap":5,"severity":"error",
            "enqueued_at":"2026-11-29T19:00:00.000Z","payload":{"order_id":42}}"#;
        let env = Envelope::decode(body).unwrap();
        assert_eq!(env.key.as_str(), "send_receipt:order=42");
        assert_eq!(env.payload, json!({"order_id": 42}));
        assert_eq!(env.cap, 5);
    }

    #[test]
    fn round_trips_and_refuses_bad_bodies() {
        let key = IdempotencyKey::builder("send_receipt").fact("order", 42).build().unwrap();
        let job = NewJob::new("send_receipt", key, json!({"order_id": 42})).unwrap();
        let env = Envelope::new(&job);
        let body = env.encode();
        assert!(body.contains(&format!(
            "\"enqueued_at\":\"{}\"",
            env.enqueued_at.to_rfc3339_opts(SecondsFormat::Millis, true)
        )));
        let back = Envelope::decode(body.as_bytes()).unwrap();
        assert_eq!((back.key, back.provider_key), (job.key.clone(), job.provider_key));
        assert_eq!(Envelope::decode(b"not json").unwrap_err().kind(), ErrorKind::Decode);
        // A producer's mistake is named by field, without the value it sent.
        let mut wrong = serde_json::from_str::<Value>(&env.encode()).unwrap();
        wrong["cap"] = json!("4111111111111111");
        let err = Envelope::decode(wrong.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not a redrive envelope: field `cap`: invalid type: string"), "{err}");
        assert!(!format!("{err} {err:?}").contains("4111"), "{err:?}");
        let mut future = serde_json::from_str::<Value>(&env.encode()).unwrap();
        future["v"] = json!(2);
        assert_eq!(Envelope::decode(future.to_string().as_bytes()).unwrap_err().kind(), ErrorKind::Decode);
    }

    #[test]
    fn a_claimed_job_travels_again_as_it_was_enqueued() {
        let key = IdempotencyKey::builder("ship").fact("parcel", 9).build().unwrap();
        let at = DateTime::parse_from_rfc3339("2026-12-01T12:00:00.250Z").unwrap().with_timezone(&Utc);
        let sent = Envelope::new(&NewJob::new("ship", key, json!({"parcel": 9})).unwrap().expires_at(at));
        let job = sent.clone().into_job(JobId("m-9".into()), 2, None);
        assert_eq!((job.id.0.as_str(), job.attempt, job.stranded, job.deadline), ("m-9", 2, 0, Some(at)));
        assert_eq!(Envelope::from_job(&job), sent, "the first enqueue time and every field kept");
    }

    #[test]
    fn a_traceparent_travels_and_old_envelopes_still_decode() {
        const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let key = IdempotencyKey::builder("ship").fact("parcel", 9).build().unwrap();
        let job = NewJob::new("ship", key, json!({"parcel": 9})).unwrap();
        assert!(!Envelope::new(&job).encode().contains("traceparent"), "no field without a context");
        let body = Envelope::new(&job.with_traceparent(TRACEPARENT).unwrap()).encode();
        assert!(body.contains(&format!("\"traceparent\":\"{TRACEPARENT}\"")), "{body}");
        let back = Envelope::decode(body.as_bytes()).unwrap();
        assert_eq!(back.traceparent.as_deref(), Some(TRACEPARENT));
        let claimed = back.clone().into_job(JobId("m-9".into()), 2, None);
        assert_eq!(claimed.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(Envelope::from_job(&claimed), back, "sent on with its context");
        // An envelope written before the field (the documented example's shape) has none.
        let old = br#"{"v":1,"kind":"ship","key":"ship:parcel=9","provider_key":"6f1c1d2e-8c1b-4a57-9a3e-2f0d6c1b7e11",
            "cap":5,"enqueued_at":"2026-11-29T19:00:00.000Z","payload":{"parcel":9}}"#;
        assert_eq!(Envelope::decode(old).unwrap().traceparent, None);
        // A broken context is dropped, and the job still decodes.
        let mut broken = serde_json::from_str::<Value>(&body).unwrap();
        broken["traceparent"] = json!("00-zz-00f067aa0ba902b7-01");
        let env = Envelope::decode(broken.to_string().as_bytes()).unwrap();
        assert_eq!((env.traceparent, env.key.as_str()), (None, "ship:parcel=9"));
    }

    #[test]
    fn a_deadline_travels_to_the_millisecond_and_is_absent_without_one() {
        let key = IdempotencyKey::builder("typing").fact("chat", 7).build().unwrap();
        let job = NewJob::new("typing", key, json!({})).unwrap();
        assert!(!Envelope::new(&job).encode().contains("deadline"), "no field without a deadline");
        let at = DateTime::parse_from_rfc3339("2026-12-01T12:00:00.250Z").unwrap().with_timezone(&Utc);
        let body = Envelope::new(&job.expires_at(at)).encode();
        assert!(body.contains("\"deadline\":\"2026-12-01T12:00:00.250Z\""), "{body}");
        assert_eq!(Envelope::decode(body.as_bytes()).unwrap().deadline, Some(at));
    }
}

debug_redacted!(Envelope {
    show: [v, kind, key, provider_key, cap, severity, enqueued_at, deadline, not_before, replay_of, traceparent],
    hide: [payload]
});
