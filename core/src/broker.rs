//! The broker kit: what message-queue backends (SQS, Azure Queue Storage) share.
//!
//! A broker backend keeps its failure records in a [`RecordStore`] (the application's
//! database); its dead-letter or poison queue is the intake, drained into the store before
//! records are read. A backend implements [`Broker`], a handful of calls on that queue and one
//! send, and gets [`DeadLetter`] and [`Replay`] from here, with the same guarantees everywhere:
//! complete, paged reads that hide nothing from other readers, and a replay that one process
//! sends at a time.
//!
//! The helpers below are the rules both brokers' messages follow: an error history of bounded
//! size, text cleaned of what a broker refuses, and a stand-in job for a body that is not an
//! envelope.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::{info, warn};

use crate::backend::{
    AttemptError, DeadLetter, FailureId, FailureQuery, FailureRecord, RecordState, Replay, ReplayOutcome, require_audit,
};
use crate::envelope::{ENVELOPE_VERSION, Envelope};
use crate::error::{Error, ErrorKind, Result, Retry};
use crate::job::{JobId, JobRecord, NewJob, Severity};
use crate::key::{IdempotencyKey, ProviderKey};
use crate::records::{RecordStore, Taken};

/// How long a replay holds its record: a second replay within it sends nothing; a replay that
/// died between taking the record and closing it leaves the record open again after it.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(300);
/// The last error kept in a record, in bytes; the rest is in the worker's log.
pub const MAX_ERROR_LEN: usize = 4096;
/// Failed attempts a message and its record carry: the first (for when the failures began) and
/// the latest ones, each error cut to [`HISTORY_ERROR_LEN`] bytes.
pub const HISTORY: usize = 6;
/// The longest error an entry of the history keeps, in bytes.
pub const HISTORY_ERROR_LEN: usize = 512;
/// Room a message keeps for its history as JSON: each entry's error (cleaned before it is cut,
/// so JSON escaping at most doubles it), attempt and time, and a name to carry it under.
pub const HISTORY_ROOM: usize = HISTORY * (HISTORY_ERROR_LEN * 2 + 80) + 32;
/// Dead-letter pages a drain takes at most in one go; the rest wait for the next read.
const DRAIN_PAGES: usize = 2_000;
/// How long a drain hides a dead-letter message between receiving it and deleting it once kept.
const DRAIN_HIDE: Duration = Duration::from_secs(60);
/// How [`Envelope::decode`] says a body is not an envelope; such a record cannot be replayed.
const NOT_AN_ENVELOPE: &str = "the message body is not a redrive envelope";

/// A message taken from the dead-letter queue by a drain, as the record it holds.
#[derive(Debug)]
pub struct Drained {
    /// The record: the worker's (written there while the store was down) or one made of a
    /// message the broker or another tool moved there.
    pub record: FailureRecord,
    /// What deletes the message, or shows it again: a receipt handle, a message id and pop
    /// receipt. Never logged.
    pub receipt: String,
}

/// A broker queue with a dead-letter queue and a [`RecordStore`]: what [`DeadLetter`] and
/// [`Replay`] need of it. Implement it and both come with it.
pub trait Broker: Send + Sync {
    /// The store that keeps this queue's failure records.
    fn record_store(&self) -> &dyn RecordStore;

    /// This queue's name in the store, unique across the brokers that share it.
    fn record_scope(&self) -> &str;

    /// One page of the dead-letter queue, hidden from other drains for `hide`; empty when the
    /// queue is. Asks every server of the broker, so that an empty page means an empty queue.
    fn receive_dead(&self, hide: Duration) -> impl Future<Output = Result<Vec<Drained>>> + Send;

    /// Deletes drained messages, now kept in the store.
    fn delete_dead(&self, drained: &[Drained]) -> impl Future<Output = Result<()>> + Send;

    /// Shows drained messages again at once (the store refused them): the next read takes them.
    fn show_dead_again(&self, drained: &[Drained]) -> impl Future<Output = ()> + Send;

    /// Refuses a job this queue cannot carry (too large, a cap over the broker's), before any
    /// record changes.
    fn check_job(&self, job: &NewJob) -> Result<()>;

    /// Sends a replayed job to the source queue with its original keys.
    fn send_replay(&self, job: &NewJob, record: &FailureId) -> impl Future<Output = Result<JobId>> + Send;

    /// One drain at a time in a process (others take other messages).
    fn drain_lock(&self) -> &tokio::sync::Mutex<()>;

    /// Removes a closed record's message from the dead-letter queue, where a drain leaves it
    /// (QStash: the entry stays while the record is open, for its retry API). Nothing by default:
    /// a drain deletes what it keeps.
    fn forget_dead(&self, _record: &FailureId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Deletes from the dead-letter queue what a purge of records older than `age` removes, before
    /// the store forgets them (else a drain would keep them again). Nothing by default.
    fn purge_dead(&self, _age: Duration) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// A test aid: a replay stops between its send and closing the record, as a crash would.
    #[doc(hidden)]
    fn stop_after_replay_send(&self) -> bool {
        false
    }
}

/// Moves the dead-letter queue's messages into the store: each received, kept, then deleted.
/// Safe to run from many processes at once (each takes other messages) and to repeat (a record
/// is kept once by its id). A message received by a drain that died is taken again a minute
/// later.
pub async fn drain<B: Broker>(broker: &B) -> Result<()> {
    let _draining = broker.drain_lock().lock().await;
    for _ in 0..DRAIN_PAGES {
        let drained = broker.receive_dead(DRAIN_HIDE).await?;
        if drained.is_empty() {
            return Ok(());
        }
        let records: Vec<FailureRecord> = drained.iter().map(|d| d.record.clone()).collect();
        match broker.record_store().keep_records(broker.record_scope(), &records).await {
            Ok(0) => {}
            Ok(new) => info!(records = new, "failure records taken from the dead-letter queue"),
            Err(e) => {
                broker.show_dead_again(&drained).await;
                return Err(e);
            }
        }
        // A message not deleted comes back and is kept again, which changes nothing.
        broker.delete_dead(&drained).await?;
    }
    Ok(())
}

impl<B: Broker> DeadLetter for B {
    /// Drains the dead-letter queue into the store on the first page, then reads the store.
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        if query.after.is_none() {
            drain(self).await?;
        }
        self.record_store().records(self.record_scope(), query).await
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        match self.record_store().record(self.record_scope(), id).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                drain(self).await?;
                self.record_store().record(self.record_scope(), id).await
            }
            found => found,
        }
    }

    async fn count_open(&self) -> Result<u64> {
        drain(self).await?;
        self.record_store().open_records(self.record_scope()).await
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let record = self.get(id).await?;
        let state = RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        if self.record_store().close_record(self.record_scope(), id, &state).await?.is_none() {
            info!(record = %id, kind = %record.kind, key = %record.key, actor, reason, "failure record discarded");
        }
        self.forget_dead(id).await
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        drain(self).await?;
        self.purge_dead(age).await?;
        self.record_store().purge_records(self.record_scope(), age).await
    }
}

impl<B: Broker> Replay for B {
    /// Takes the record in the store (so that no other replay, in any process, sends it), sends
    /// the job back with its original keys, then closes the record. Retried after a failure
    /// past the send, within five minutes, it sends nothing more; a replay that died before
    /// closing leaves the record open again after five minutes, and a replay then sends it
    /// again (the effect ledger keeps the effect to one).
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        let record = self.get(id).await?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state));
        }
        if record.last_error.starts_with(NOT_AN_ENVELOPE) {
            // Sent back wrapped in an envelope, its body would reach a handler as a job.
            return Err(Error::new(
                ErrorKind::Decode,
                format!(
                    "record {id} holds a message body that is not a redrive envelope: it cannot be replayed; \
                     enqueue the corrected job and discard the record"
                ),
            ));
        }
        // Checked before the take: a job that cannot be sent leaves the record as it was.
        let mut job =
            NewJob::new(record.kind.clone(), record.key.clone(), record.payload.clone())?.with_cap(record.cap);
        job.provider_key = record.provider_key;
        job.severity = record.severity;
        self.check_job(&job)?;
        let (store, scope) = (self.record_store(), self.record_scope());
        if let Taken::Closed(state) = store.take_for_replay(scope, id, REPLAY_WINDOW).await? {
            return Ok(ReplayOutcome::AlreadyClosed(state));
        }
        let sent = match self.send_replay(&job, id).await {
            Ok(sent) => sent,
            Err(e) => {
                // Refused by the broker (the sender's fault): nothing was sent, the record is open
                // again at once. A timeout or a server error may have sent it: the record stays
                // taken until the window lapses, so that a retry now sends nothing twice.
                if e.retry() == Retry::Permanent {
                    let _ = store.close_record(scope, id, &RecordState::Open).await;
                }
                return Err(e);
            }
        };
        if self.stop_after_replay_send() {
            return Err(Error::temporary("injected: the replay stopped after its send"));
        }
        let replayed = RecordState::Replayed { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        store.close_record(scope, id, &replayed).await?;
        info!(record = %id, kind = %record.kind, key = %record.key, job = %sent, actor, reason, "failure record replayed");
        Ok(ReplayOutcome::Replayed(sent))
    }
}

/// `errors` with attempt `attempt`'s `error` added: cleaned, cut to [`HISTORY_ERROR_LEN`], and
/// the history kept to its first entry and the latest, [`HISTORY`] at most.
pub fn add_error(mut errors: Vec<AttemptError>, attempt: u32, error: &str) -> Vec<AttemptError> {
    errors.push(AttemptError { attempt, at: Utc::now(), error: cut(&clean(error), HISTORY_ERROR_LEN).to_owned() });
    if errors.len() > HISTORY {
        errors.drain(1..errors.len() - (HISTORY - 1));
    }
    errors
}

/// The last error as a record keeps it: cleaned and cut to [`MAX_ERROR_LEN`].
pub fn last_error(error: &str) -> String {
    cut(&clean(error), MAX_ERROR_LEN).to_owned()
}

/// Text every broker accepts: the characters XML allows. Any other (a control character such as
/// ESC or form feed, which an error text may well carry) is written as `\u{1b}`, so that a send
/// never fails on it.
pub fn clean(text: &str) -> Cow<'_, str> {
    let allowed = |c: char| matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..);
    if text.chars().all(allowed) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars().map(|c| if allowed(c) { c.to_string() } else { format!("\\u{{{:x}}}", c as u32) }).collect(),
    )
}

/// At most `max` bytes of `text`, cut at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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
        payload: Value::String(body.to_owned()),
    };
    (stand_in, Some(why))
}

/// A batch enqueue that stopped part-way on `broker`: how many jobs were sent and which keys
/// were not (`sent[i]` is whether `jobs[i]` was), for the caller to enqueue only those again;
/// with the kind and retry flag of the failure that stopped it.
pub fn not_all_sent(broker: &str, jobs: &[NewJob], sent: &[bool], why: &str, cause: (ErrorKind, Retry)) -> Error {
    let unsent: Vec<&str> = jobs.iter().zip(sent).filter(|(_, s)| !**s).map(|(j, _)| j.key.as_str()).collect();
    let shown = unsent.iter().take(20).copied().collect::<Vec<_>>().join(", ");
    let more = if unsent.len() > 20 { format!(" and {} more", unsent.len() - 20) } else { String::new() };
    let message = format!(
        "{broker}: {} of {} jobs were sent; not sent ({why}): {shown}{more}; enqueue only these again",
        jobs.len() - unsent.len(),
        jobs.len()
    );
    Error::new(cause.0, message).with_retry(cause.1)
}

/// The job a received message carries, as the worker gets it: `env` (or its stand-in, with
/// `undecodable` saying why), under `id`, at `attempt`. Brokers cannot tell a lapsed claim from
/// a started one, so nothing is counted as stranded.
pub fn job_record(id: JobId, env: Envelope, attempt: u32, undecodable: Option<String>) -> JobRecord {
    JobRecord {
        id,
        kind: env.kind,
        key: env.key,
        provider_key: env.provider_key,
        payload: env.payload,
        attempt,
        cap: env.cap,
        severity: env.severity,
        enqueued_at: env.enqueued_at,
        deadline: env.deadline,
        not_before: env.not_before,
        stranded: 0,
        undecodable,
    }
}

/// The open record of a job that `env` carried, read from a dead-letter message: failed
/// `attempts` times with `errors` (oldest first) and `last_error`, the last failure at
/// `failed_at`.
pub fn dead_record(
    ids: (FailureId, JobId),
    env: Envelope,
    last_error: String,
    errors: Vec<AttemptError>,
    attempts: u32,
    failed_at: DateTime<Utc>,
) -> FailureRecord {
    FailureRecord {
        id: ids.0,
        job_id: ids.1,
        kind: env.kind,
        key: env.key,
        provider_key: env.provider_key,
        payload: env.payload,
        last_error,
        first_failed_at: errors.first().map_or(failed_at, |e| e.at),
        errors,
        attempts,
        cap: env.cap,
        severity: env.severity,
        last_failed_at: failed_at,
        state: RecordState::Open,
    }
}

/// Logs that a record could not be kept in the store and goes to the broker's dead-letter queue.
pub fn store_down(job: &crate::job::JobRecord, error: &Error) {
    warn!(job = %job.id, kind = %job.kind, key = %job.key, attempt = job.attempt, error = %error,
        "the failure record store failed; the record goes to the dead-letter queue, to be drained later");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cleaned_of_what_brokers_refuse_and_cut_at_characters() {
        assert_eq!(clean("plain text, tabs\tand newlines\n"), "plain text, tabs\tand newlines\n");
        assert_eq!(clean("red \u{1b}[31m page\u{c} \u{0}"), "red \\u{1b}[31m page\\u{c} \\u{0}");
        assert_eq!(cut("añb", 2), "a", "cut at a character boundary");
    }

    #[test]
    fn the_history_keeps_the_first_and_the_latest_errors() {
        let mut errors = Vec::new();
        for attempt in 1..=9 {
            errors = add_error(errors, attempt, &"x".repeat(2000));
        }
        let attempts: Vec<u32> = errors.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, [1, 5, 6, 7, 8, 9]);
        assert!(errors.iter().all(|e| e.error.len() == HISTORY_ERROR_LEN));
        assert!(serde_json::to_string(&errors).unwrap().len() <= HISTORY_ROOM);
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
}
