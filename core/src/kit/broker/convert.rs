//! Conversions between what a broker's message carries and what the worker and the record store
//! see: a failure record from a claimed job, a stand-in job for a body that is not an envelope.
//! (A job's envelope and back: [`Envelope::new`], [`Envelope::from_job`], [`Envelope::into_job`].)

use chrono::{DateTime, Utc};
use serde_json::Value;

#[cfg(doc)]
use super::add_error;
use super::history::{add_error_at, last_error};
use crate::backend::{AttemptError, FailureId, FailureRecord, RecordState};
use crate::envelope::{ENVELOPE_VERSION, Envelope};
use crate::job::{JobId, JobRecord, Severity};
use crate::key::{IdempotencyKey, ProviderKey};

/// How [`Envelope::decode`] says a body is not an envelope; such a record cannot be replayed.
pub(super) const NOT_AN_ENVELOPE: &str = "the message body is not a redrive envelope";

impl FailureRecord {
    /// The open record `id` of `job`, whose attempt (`job.attempt`) failed at `at` with `error`:
    /// kept as the last error (see [`last_error`]) and added to `history`, the
    /// failed attempts the message carried (see [`add_error`]).
    pub fn from_job(
        id: FailureId,
        job: &JobRecord,
        error: &str,
        history: Vec<AttemptError>,
        at: DateTime<Utc>,
    ) -> Self {
        let errors = add_error_at(history, job.attempt, error, at);
        Self::open(id, job.clone(), last_error(error), errors, at)
    }
}

/// The open record of a job that `env` carried, read from a dead-letter message: failed
/// `attempts` times with `errors` (oldest first, the last included) and `last_error`, the last
/// failure at `failed_at`.
pub fn dead_record(
    ids: (FailureId, JobId),
    env: Envelope,
    last_error: String,
    errors: Vec<AttemptError>,
    attempts: u32,
    failed_at: DateTime<Utc>,
) -> FailureRecord {
    FailureRecord::open(ids.0, env.into_job(ids.1, attempts, None), last_error, errors, failed_at)
}

impl FailureRecord {
    /// The open record `id` of `job` as it failed its last attempt (`job.attempt`) at
    /// `failed_at`: `last_error` and the history `errors` (oldest first, the last included) as
    /// given, nothing cut, the trace id of its `traceparent` kept. What every backend's dead
    /// letter builds from the claimed job (memory, the brokers through [`FailureRecord::from_job`]
    /// and [`dead_record`]).
    pub fn open(
        id: FailureId,
        job: JobRecord,
        last_error: String,
        errors: Vec<AttemptError>,
        failed_at: DateTime<Utc>,
    ) -> Self {
        Self {
            trace_id: job.trace_id().map(str::to_owned),
            id,
            job_id: job.id,
            kind: job.kind,
            key: job.key,
            provider_key: job.provider_key,
            payload: job.payload,
            last_error,
            first_failed_at: errors.first().map_or(failed_at, |e| e.at),
            errors,
            attempts: job.attempt,
            cap: job.cap,
            severity: job.severity,
            last_failed_at: failed_at,
            state: RecordState::Open,
            replay_of: job.replay_of,
            amended: None,
        }
    }
}

/// What a broker knows of a message beside its body, for a body that is not an envelope.
#[derive(Debug, Default)]
pub struct Known {
    /// The kind a producer named beside the body.
    pub kind: Option<String>,
    /// The key a producer named beside the body.
    pub key: Option<String>,
    /// The provider key a producer named beside the body.
    pub provider_key: Option<String>,
}

/// The job a message body carries: its envelope, or, for a body that is not one, a stand-in
/// made of what the broker knows of it (`known`; the key defaults to `<broker>:message=<id>`)
/// with the body as its payload and a cap of 1, and why it is not an envelope (naming no value
/// of the body). The worker records such a job as failed at once, without a handler.
pub fn carried_job(
    broker: &str,
    id: &str,
    body: &str,
    known: Known,
    sent: DateTime<Utc>,
) -> (Envelope, Option<String>) {
    let why = match Envelope::decode(body.as_bytes()) {
        Ok(env) => return (env, None),
        Err(e) => e.message().to_owned(),
    };
    let stand_in = Envelope {
        v: ENVELOPE_VERSION,
        kind: known.kind.unwrap_or_else(|| "unknown".into()),
        key: known
            .key
            .and_then(|k| IdempotencyKey::parse(k).ok())
            .unwrap_or_else(|| IdempotencyKey::parse(format!("{broker}:message={id}")).expect("a valid key")),
        provider_key: known
            .provider_key
            .and_then(|p| p.parse().ok())
            .map_or_else(ProviderKey::mint, ProviderKey::from_uuid),
        cap: 1,
        severity: Severity::Error,
        enqueued_at: sent,
        // An unreadable body is recorded at once, whatever its deadline said.
        deadline: None,
        not_before: None,
        replay_of: None,
        traceparent: None,
        payload: Value::String(body.to_owned()),
    };
    (stand_in, Some(why))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::job::NewJob;

    fn claimed(attempt: u32) -> JobRecord {
        let key = IdempotencyKey::builder("ship").fact("parcel", 7).build().unwrap();
        let job = NewJob::new("ship", key, json!({ "parcel": 7 })).unwrap().with_cap(3);
        Envelope::new(&job).into_job(JobId("m-1".into()), attempt, None)
    }

    #[test]
    fn a_body_that_is_not_an_envelope_is_carried_as_it_is() {
        let (env, undecodable) = carried_job("sqs", "m-1", "<xml/>", Known::default(), Utc::now());
        let why = undecodable.expect("not an envelope");
        assert!(why.starts_with(NOT_AN_ENVELOPE), "{why}");
        assert!(!why.contains("xml"), "the body is not quoted: {why}");
        assert_eq!((env.key.as_str(), env.cap), ("sqs:message=m-1", 1));
        assert_eq!(env.payload, Value::String("<xml/>".into()));
    }

    #[test]
    fn a_record_from_a_job_adds_the_failed_attempt_to_its_history() {
        let at = Utc::now();
        let job = claimed(3);
        let earlier = vec![AttemptError { attempt: 1, at: at - chrono::Duration::minutes(5), error: "first".into() }];
        let record = FailureRecord::from_job(FailureId("m-1".into()), &job, "boom \u{1b}", earlier.clone(), at);
        assert_eq!((record.id.0.as_str(), &record.job_id, &record.key), ("m-1", &job.id, &job.key));
        assert_eq!((record.attempts, record.cap, &record.payload), (3, 3, &job.payload));
        assert_eq!(record.last_error, "boom \\u{1b}", "cleaned");
        let attempts: Vec<u32> = record.errors.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, [1, 3]);
        assert_eq!((record.first_failed_at, record.last_failed_at, record.errors[1].at), (earlier[0].at, at, at));
        assert_eq!(record.state, RecordState::Open);
        let first = FailureRecord::from_job(FailureId("m-1".into()), &job, "boom", Vec::new(), at);
        assert_eq!(first.first_failed_at, at, "no history: the first failure is this one");
    }

    #[test]
    fn a_dead_letter_message_keeps_the_history_it_is_given() {
        let at = Utc::now();
        let env = Envelope::from_job(&claimed(1));
        let errors = vec![AttemptError { attempt: 5, at, error: "moved".into() }];
        let ids = (FailureId("d-1".into()), JobId("j-1".into()));
        let record = dead_record(ids, env.clone(), "moved".into(), errors.clone(), 5, at);
        assert_eq!((record.job_id.0.as_str(), record.attempts, &record.errors), ("j-1", 5, &errors));
        assert_eq!((&record.key, &record.payload, record.cap), (&env.key, &env.payload, env.cap));
    }
}
