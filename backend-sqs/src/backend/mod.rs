//! `SqsBackend`: the redrive contracts on an SQS queue and its dead-letter queue, with the failure
//! records in a [`RecordStore`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use redrive_core::{
    AttemptError, Backend, Capabilities, Claim, Claimed, Counts, Dedupe, Enqueue, Enqueued, Envelope, Error, ErrorKind,
    FailureId, FailureRecord, IdempotencyKey, JobId, Kinds, Lease, NewJob, QueueStats, RecordState, RecordStore, Renew,
    Result,
};
use serde_json::Value;
use tracing::warn;

mod message;
mod records;

use self::message::*;
use self::records::carried_job;
use redrive_core::broker::HISTORY_ROOM;

use crate::config::{QueueSetup, SqsConfig};
use crate::delete::Deleter;
use crate::error::sdk;

const ATTR_KIND: &str = "redrive-kind";
const ATTR_KEY: &str = "redrive-key";
const ATTR_PROVIDER_KEY: &str = "redrive-provider-key";
const ATTR_ERROR: &str = "redrive-error";
const ATTR_ATTEMPTS: &str = "redrive-attempts";
const ATTR_FAILED_AT: &str = "redrive-failed-at";
const ATTR_SOURCE_ID: &str = "redrive-source-id";
/// On a deferred copy: the attempts the job had spent before it, added to the copy's receive count.
const ATTR_SPENT: &str = "redrive-spent";
/// The job's failed attempts so far (JSON, oldest first, bounded: see [`history`]), carried by
/// each retried copy and by the record.
const ATTR_ERRORS: &str = "redrive-errors";
/// On a deferred or retried copy: the job's id, its first message's id, kept across copies.
const ATTR_JOB_ID: &str = "redrive-job-id";
/// Room kept at enqueue for what a copy adds, so that every message can be deferred:
/// [`ATTR_SPENT`] (a `u32` in decimal) and [`ATTR_JOB_ID`] (a message id, 36 characters on AWS;
/// 100 allowed), each with its name and SQS's allowance for the type.
const COPY_ROOM: usize = ATTR_SPENT.len() + 6 + 10 + ATTR_JOB_ID.len() + 6 + 100;
/// Room for what the message adds around a payload: the envelope's fields (names, kind, key,
/// provider key, times) and the first attributes (kind, key, provider key), a few hundred bytes
/// for a key of ordinary length. Kept out of [`Capabilities::max_payload`], so that a payload
/// of the declared size is accepted; a key long enough to need more leaves less room, and
/// enqueue says so.
const ENVELOPE_ROOM: usize = 1024;
/// The longest retention SQS accepts (14 days): what the DLQ keeps.
const MAX_RETENTION: Duration = Duration::from_secs(1_209_600);
/// The largest message SQS accepts (1 MiB): what the DLQ takes.
const MAX_MESSAGE: usize = 1_048_576;
/// The longest visibility SQS accepts (12 h).
const MAX_VISIBILITY: Duration = Duration::from_secs(43_200);
/// The longest `DelaySeconds` SQS accepts (15 min); a longer deferral comes back early and is
/// deferred again.
const MAX_DELAY: Duration = Duration::from_secs(900);
/// Receives of the source queue [`SqsBackend::holds_text`] makes: short polls sample the queue.
const LOOKS: usize = 5;

/// redrive on Amazon SQS: the source queue carries the jobs; the failure records live in a
/// [`RecordStore`] (the application's database), and the dead-letter queue is their intake for
/// what the redrive policy moves. Clones share one client.
#[derive(Clone)]
pub struct SqsBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    source: QueueInfo,
    dlq: QueueInfo,
    /// Where the failure records are, and this queue's name there (its ARN).
    records: Arc<dyn RecordStore>,
    scope: String,
    max_receive_count: u32,
    max_wait: Duration,
    /// The latest receipt this process got for each message it holds: SQS accepts an old
    /// receipt handle for some calls, so fencing within a process is done here.
    held: Mutex<HashMap<String, Held>>,
    deleter: Deleter,
    /// One drain of the DLQ at a time in a process (others take other messages).
    draining: tokio::sync::Mutex<()>,
    /// A test aid: replays stop between their send and closing the record.
    fail_after_replay_send: AtomicBool,
    requests: Arc<AtomicU64>,
}

struct Held {
    receipt: String,
    /// The message as received, to send again on a deferral or to the DLQ. Dropped once the
    /// message is handed back by its visibility (retry, release), when the entry only fences.
    message: Option<Kept>,
    /// This receive took the message from a lease of this process that was not settled (its
    /// visibility lapsed under a running handler): the entry fences that lease even once a
    /// deferral has deleted the message, or its late settlement would act on a job now carried
    /// by the copy.
    supersedes: bool,
    received: std::time::Instant,
}

/// A held message's body and attributes, exactly as received. Never logged.
struct Kept {
    body: String,
    attrs: HashMap<String, MessageAttributeValue>,
    /// The attempt this receive is (receive count plus [`ATTR_SPENT`]).
    attempt: u32,
}

/// Past this many held messages, entries older than [`HELD_FOR`] are dropped: a message retried
/// here and finished by another process would otherwise stay forever.
const HELD_MAX: usize = 10_000;
const HELD_FOR: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone)]
struct QueueInfo {
    url: String,
    fifo: bool,
    max_message_size: usize,
}

impl std::fmt::Debug for SqsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsBackend").field("queue", &self.inner.source.url).finish_non_exhaustive()
    }
}

impl SqsBackend {
    async fn client(config: &SqsConfig, requests: &Arc<AtomicU64>) -> Client {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(region) = &config.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some((key, secret)) = &config.static_credentials {
            let credentials = aws_sdk_sqs::config::Credentials::new(key, secret, None, None, "redrive-static");
            loader = loader.credentials_provider(credentials);
        }
        let shared = loader.load().await;
        let sqs = aws_sdk_sqs::config::Builder::from(&shared).interceptor(CountRequests(Arc::clone(requests))).build();
        Client::from_conf(sqs)
    }

    /// Connects to an existing queue and checks its setup, refusing what would lose data: no
    /// redrive policy, a missing dead-letter queue, a DLQ that does not keep messages longer than
    /// the source or takes smaller ones, a record store that is not ready (run its migrations).
    /// `records` keeps the failure records: your database's, such as a migrated
    /// `redrive_postgres::PgBackend`.
    pub async fn connect(config: SqsConfig, records: impl RecordStore) -> Result<Self> {
        check_queue_name(&config.queue)?;
        let requests = Arc::new(AtomicU64::new(0));
        let client = Self::client(&config, &requests).await;
        let source_url = queue_url(&client, &config.queue).await?;
        let attrs = queue_attributes(&client, &source_url).await?;
        let policy = attrs.get(&QueueAttributeName::RedrivePolicy).ok_or_else(|| {
            config_error(format!(
                "queue {} has no redrive policy: a worker crashing on the last attempt would lose the job",
                config.queue
            ))
        })?;
        let policy: Value =
            serde_json::from_str(policy).map_err(|_| config_error("the queue's redrive policy is not JSON"))?;
        let dlq_arn =
            policy["deadLetterTargetArn"].as_str().ok_or_else(|| config_error("redrive policy without a target"))?;
        let max_receive_count = match &policy["maxReceiveCount"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| config_error("redrive policy without maxReceiveCount"))? as u32;
        let dlq_name = dlq_arn.rsplit(':').next().unwrap_or_default();
        let dlq_url = queue_url(&client, dlq_name)
            .await
            .map_err(|_| config_error(format!("the dead-letter queue {dlq_name} does not exist")))?;
        let dlq_attrs = queue_attributes(&client, &dlq_url).await?;
        let retention = |a: &HashMap<QueueAttributeName, String>| {
            a.get(&QueueAttributeName::MessageRetentionPeriod).and_then(|v| v.parse::<u64>().ok()).unwrap_or(345_600)
        };
        // A message moved by the redrive policy keeps its first enqueue time, so the DLQ must keep
        // messages longer than the source did (AWS's guidance), not just as long.
        if retention(&dlq_attrs) <= retention(&attrs) {
            return Err(config_error(format!(
                "the dead-letter queue keeps messages {} s, not longer than the source's {} s: records would expire \
                 before anyone reads them",
                retention(&dlq_attrs),
                retention(&attrs)
            )));
        }
        let size = |a: &HashMap<QueueAttributeName, String>| {
            a.get(&QueueAttributeName::MaximumMessageSize).and_then(|v| v.parse::<usize>().ok()).unwrap_or(262_144)
        };
        if size(&dlq_attrs) < size(&attrs) {
            return Err(config_error(format!(
                "the dead-letter queue takes messages up to {} bytes, less than the source's {}: a job's failure \
                 record might not fit",
                size(&dlq_attrs),
                size(&attrs)
            )));
        }
        // Records are kept under the source queue's ARN: unique across regions and accounts.
        let scope = attrs.get(&QueueAttributeName::QueueArn).cloned().unwrap_or_else(|| source_url.clone());
        records.open_records(&scope).await.map_err(|e| {
            Error::new(e.kind(), format!("the failure record store is not ready (has it been migrated?): {e}"))
        })?;
        let info = |url: String, a: &HashMap<QueueAttributeName, String>| QueueInfo {
            url,
            fifo: a.get(&QueueAttributeName::FifoQueue).is_some_and(|v| v == "true"),
            max_message_size: size(a),
        };
        let deleter = Deleter::start(client.clone(), source_url.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                source: info(source_url, &attrs),
                dlq: info(dlq_url, &dlq_attrs),
                records: Arc::new(records),
                scope,
                max_receive_count,
                max_wait: config.wait,
                client,
                held: Mutex::default(),
                deleter,
                draining: tokio::sync::Mutex::new(()),
                fail_after_replay_send: AtomicBool::new(false),
                requests,
            }),
        })
    }

    /// Creates (or finds) the source queue and its dead-letter queue with the redrive policy,
    /// then connects.
    pub async fn setup(config: SqsConfig, setup: QueueSetup, records: impl RecordStore) -> Result<Self> {
        check_queue_name(&config.queue)?;
        let requests = Arc::new(AtomicU64::new(0));
        let client = Self::client(&config, &requests).await;
        let suffix = if setup.fifo { ".fifo" } else { "" };
        let base = config.queue.strip_suffix(".fifo").unwrap_or(&config.queue).to_owned();
        let (source, dlq) = (format!("{base}{suffix}"), format!("{base}-dlq{suffix}"));
        if setup.retention >= MAX_RETENTION {
            return Err(config_error(format!(
                "a retention of {} s leaves the dead-letter queue no room to keep records longer: SQS keeps a \
                 message 14 days ({} s) at most",
                setup.retention.as_secs(),
                MAX_RETENTION.as_secs()
            )));
        }
        let retention = setup.retention.as_secs().max(60).to_string();
        let size = setup.max_message_size.clamp(1024, MAX_MESSAGE).to_string();
        let fifo = || setup.fifo.then(|| (QueueAttributeName::FifoQueue, "true".to_owned()));
        // The DLQ keeps messages as long as SQS allows and takes the largest, so that every job
        // the source accepts has room for its record until it is drained into the store.
        let dlq_attrs = [
            (QueueAttributeName::MessageRetentionPeriod, MAX_RETENTION.as_secs().to_string()),
            (QueueAttributeName::MaximumMessageSize, MAX_MESSAGE.to_string()),
        ];
        let dlq_url = create_queue(&client, &dlq, &dlq_attrs.into_iter().chain(fifo()).collect::<Vec<_>>()).await?;
        let dlq_arn = queue_attributes(&client, &dlq_url)
            .await?
            .remove(&QueueAttributeName::QueueArn)
            .ok_or_else(|| Error::temporary("the new DLQ has no ARN"))?;
        let policy = serde_json::json!({ "deadLetterTargetArn": dlq_arn, "maxReceiveCount": setup.max_receive_count });
        let source_attrs = [
            (QueueAttributeName::MessageRetentionPeriod, retention),
            (QueueAttributeName::MaximumMessageSize, size),
            (QueueAttributeName::RedrivePolicy, policy.to_string()),
        ];
        create_queue(&client, &source, &source_attrs.into_iter().chain(fifo()).collect::<Vec<_>>()).await?;
        Self::connect(SqsConfig { queue: source, ..config }, records).await
    }

    /// API requests sent so far (every HTTP attempt), for cost and efficiency figures.
    pub fn request_count(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The source queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.inner.source.url
    }

    /// The dead-letter queue's URL: the redrive policy's target, drained into the record store.
    pub fn dead_letter_queue_url(&self) -> &str {
        &self.inner.dlq.url
    }

    /// The name this queue's records have in the [`RecordStore`]: the source queue's ARN.
    pub fn record_scope(&self) -> &str {
        &self.inner.scope
    }

    /// The largest message the source queue accepts, envelope and attributes included.
    pub fn max_message_size(&self) -> usize {
        self.inner.source.max_message_size
    }

    /// The redrive policy's `maxReceiveCount`: no job may have a higher cap.
    pub fn max_receive_count(&self) -> u32 {
        self.inner.max_receive_count
    }

    /// Whether `text` appears in a message body or attribute on the source queue or the DLQ, in
    /// a failure record, or in a message this process holds. A test aid (a purge forgets
    /// payloads): the source queue is sampled by a few receives that leave its messages visible
    /// to workers, but each counts a receive against the redrive policy; the DLQ is drained.
    #[doc(hidden)]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let held_here = {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            held.values().filter_map(|h| h.message.as_ref()).any(|k| mentions(&k.body, Some(&k.attrs), text))
        };
        if held_here {
            return Ok(true);
        }
        let found = |m: &Message| mentions(m.body().unwrap_or_default(), m.message_attributes(), text);
        for _ in 0..LOOKS {
            let out = self
                .inner
                .client
                .receive_message()
                .queue_url(&self.inner.source.url)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .wait_time_seconds(0)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sdk(e, "look through the queue"))?;
            if out.messages().iter().any(found) {
                return Ok(true);
            }
        }
        redrive_core::broker::drain(self).await?;
        self.inner.records.records_mention(&self.inner.scope, text).await
    }

    /// Replays stop between their send and closing the record, as a crash there would: a test
    /// aid for replays retried after such a failure.
    #[doc(hidden)]
    pub fn fail_replays_after_send(&self, fail: bool) {
        self.inner.fail_after_replay_send.store(fail, Ordering::Relaxed);
    }

    /// The largest message a job may be, attributes included: what the source takes, with room
    /// for a deferral's attribute, and what leaves room for its record in the DLQ.
    fn max_message(&self) -> usize {
        self.inner.source.max_message_size.min(self.inner.dlq.max_message_size.saturating_sub(RECORD_ROOM))
    }

    fn outgoing(&self, job: &NewJob) -> Result<(String, HashMap<String, MessageAttributeValue>)> {
        if job.cap > self.inner.max_receive_count {
            return Err(config_error(format!(
                "job {} has a cap of {}, above the queue's maxReceiveCount of {}: SQS would dead-letter it early",
                job.key, job.cap, self.inner.max_receive_count
            )));
        }
        // The declared limit first: what is refused does not depend on the key's length.
        job.check_size(self.capabilities().max_payload)?;
        let body = Envelope::new(job).encode();
        let attrs = HashMap::from([
            (ATTR_KIND.to_owned(), string_attr(&job.kind)),
            (ATTR_KEY.to_owned(), string_attr(job.key.as_str())),
            (ATTR_PROVIDER_KEY.to_owned(), string_attr(&job.provider_key.to_string())),
        ]);
        let size = message_size(&body, &attrs) + COPY_ROOM + HISTORY_ROOM;
        if size > self.max_message() {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "job {} is {size} bytes as a message, over the {} bytes that leave room for its failure record",
                    job.key,
                    self.max_message()
                ),
            ));
        }
        Ok((body, attrs))
    }

    /// Sends one job to the source queue, delayed until its time ([`Self::send_delay`]); on FIFO
    /// queues its group is its key (no head-of-line blocking across effects) and `dedupe` its
    /// deduplication id.
    async fn send(&self, job: &NewJob, dedupe: String, what: &str) -> Result<JobId> {
        let (body, attrs) = self.outgoing(job)?;
        let delay = self.send_delay(job);
        self.send_to(&self.inner.source, body, attrs, (&job.key, dedupe), delay, what).await
    }

    /// The `DelaySeconds` a job is sent with: the time to its `not_before`, rounded up to whole
    /// seconds so that it never arrives early, at most SQS's 15 minutes (a later job arrives
    /// early and the worker puts it back until its time, at no attempt's cost). `None` when it
    /// is due, and on FIFO queues, which refuse a per-message delay.
    fn send_delay(&self, job: &NewJob) -> Option<i32> {
        if self.inner.source.fifo {
            return None;
        }
        let wait = (job.not_before? - Utc::now()).to_std().ok()?;
        Some(wait.min(MAX_DELAY).as_secs_f64().ceil() as i32).filter(|&s| s > 0)
    }

    /// Sends one message to `queue`: on FIFO grouped by `key` and deduplicated by `dedupe`, on a
    /// standard queue delayed by `delay` seconds.
    async fn send_to(
        &self,
        queue: &QueueInfo,
        body: String,
        attrs: HashMap<String, MessageAttributeValue>,
        (key, dedupe): (&IdempotencyKey, String),
        delay: Option<i32>,
        what: &str,
    ) -> Result<JobId> {
        let mut request = self
            .inner
            .client
            .send_message()
            .queue_url(&queue.url)
            .message_body(body)
            .set_message_attributes(Some(attrs));
        if queue.fifo {
            request = request.message_group_id(key.as_str()).message_deduplication_id(dedupe);
        } else {
            request = request.set_delay_seconds(delay);
        }
        let out = request.send().await.map_err(|e| sdk(e, what))?;
        Ok(JobId(out.message_id.unwrap_or_default()))
    }

    fn fence(&self, lease: &Lease) -> Result<()> {
        let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get(&lease.job_id.0) {
            Some(h) if h.receipt != lease.token => {
                Err(Error::new(ErrorKind::LeaseLost, format!("message {} was received again since", lease.job_id)))
            }
            _ => Ok(()),
        }
    }

    fn forget(&self, lease: &Lease) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(&lease.job_id.0).is_some_and(|h| h.receipt == lease.token) {
            held.remove(&lease.job_id.0);
        }
    }

    /// The held message behind `lease`, taken out of its entry: the caller sends it on or hands
    /// the message back, and the entry goes on fencing with its receipt alone.
    fn take_message(&self, lease: &Lease) -> Option<Kept> {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get_mut(&lease.job_id.0).filter(|h| h.receipt == lease.token).and_then(|h| h.message.take())
    }

    /// After a deferral deleted the message: its entry goes, unless it fences an older lease.
    fn forget_deferred(&self, lease: &Lease) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(&lease.job_id.0).is_some_and(|h| h.receipt == lease.token && !h.supersedes) {
            held.remove(&lease.job_id.0);
        }
    }

    /// Sends a copy of a held message (`body` and `attrs`) delayed by `delay` (at most SQS's 15
    /// minutes), then deletes the original. The copy first: if the delete then fails, both are
    /// delivered, which at-least-once delivery allows and the effect ledger dedupes; the other
    /// order could lose the job.
    async fn replace_by_copy(
        &self,
        lease: &Lease,
        body: String,
        attrs: HashMap<String, MessageAttributeValue>,
        delay: Duration,
        what: &str,
    ) -> Result<()> {
        self.inner
            .client
            .send_message()
            .queue_url(&self.inner.source.url)
            .message_body(body)
            .set_message_attributes(Some(attrs))
            .delay_seconds(delay.as_secs_f64().ceil() as i32)
            .send()
            .await
            .map_err(|e| sdk(e, what))?;
        self.forget_deferred(lease);
        self.inner.deleter.delete(lease.token.clone()).await
    }

    /// Hands the message back by its visibility; its body is no longer needed here.
    async fn hand_back(&self, lease: &Lease, after: Duration, what: &str) -> Result<()> {
        self.set_visibility(lease, after, what).await?;
        self.take_message(lease);
        Ok(())
    }

    async fn set_visibility(&self, lease: &Lease, to: Duration, what: &str) -> Result<()> {
        self.fence(lease)?;
        self.inner
            .client
            .change_message_visibility()
            .queue_url(&self.inner.source.url)
            .receipt_handle(&lease.token)
            .visibility_timeout(secs(to))
            .send()
            .await
            .map_err(|e| sdk(e, what))?;
        Ok(())
    }

    /// The record as a DLQ message: the job's body with the record in attributes, the error
    /// cleaned of what SQS refuses and cut to fit the DLQ (a job from another producer may not
    /// have left the room enqueue keeps).
    async fn send_record_to_dlq(
        &self,
        lease: &Lease,
        job_id: &JobId,
        body: String,
        record: &FailureRecord,
        errors: &str,
    ) -> Result<()> {
        let mut last_error = record.last_error.as_str();
        let attrs = |last_error: &str| {
            HashMap::from([
                (ATTR_KIND.to_owned(), string_attr(&record.kind)),
                (ATTR_KEY.to_owned(), string_attr(record.key.as_str())),
                (ATTR_PROVIDER_KEY.to_owned(), string_attr(&record.provider_key.to_string())),
                (ATTR_ERROR.to_owned(), string_attr(last_error)),
                (ATTR_ATTEMPTS.to_owned(), string_attr(&record.attempts.to_string())),
                (
                    ATTR_FAILED_AT.to_owned(),
                    string_attr(&record.last_failed_at.to_rfc3339_opts(SecondsFormat::Millis, true)),
                ),
                (ATTR_SOURCE_ID.to_owned(), string_attr(&lease.job_id.0)),
                (ATTR_JOB_ID.to_owned(), string_attr(&job_id.0)),
                (ATTR_ERRORS.to_owned(), string_attr(errors)),
            ])
        };
        let over = message_size(&body, &attrs(last_error)).saturating_sub(self.inner.dlq.max_message_size);
        if over > 0 {
            last_error = redrive_core::broker::cut(last_error, last_error.len().saturating_sub(over));
        }
        let attrs = attrs(last_error);
        self.send_to(
            &self.inner.dlq,
            body,
            attrs,
            (&record.key, lease.job_id.0.clone()),
            None,
            "send to the dead-letter queue",
        )
        .await?;
        Ok(())
    }

    fn claimed_from(&self, m: Message) -> Option<Claimed> {
        let (id, receipt) = (m.message_id?, m.receipt_handle?);
        let body = m.body.unwrap_or_default();
        let attrs = m.message_attributes.unwrap_or_default();
        let system = m.attributes.unwrap_or_default();
        let receives: u32 =
            system.get(&MessageSystemAttributeName::ApproximateReceiveCount).and_then(|v| v.parse().ok()).unwrap_or(1);
        // A deferred copy starts its receive count afresh: the spent attempts travel with it.
        let attempt = receives.saturating_add(spent(&attrs));
        let sent = sent_at(&system);
        // Not an envelope: handed over marked as such, so the worker records a decode failure
        // without looking for a handler, with the body kept for a person to read.
        let (env, undecodable) = carried_job(&id, &body, Some(&attrs), sent);
        // A copy (deferred or retried) carries its job's id: the first message's.
        let job_id = attrs.get(ATTR_JOB_ID).and_then(|v| v.string_value()).map_or_else(|| id.clone(), str::to_owned);
        let job = redrive_core::broker::job_record(JobId(job_id), env, attempt, undecodable);
        let message = Some(Kept { body, attrs, attempt });
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() >= HELD_MAX {
            held.retain(|_, h| h.received.elapsed() < HELD_FOR);
        }
        // An entry still holding its message was not settled: its lease may yet be presented.
        let supersedes = held.get(&id).is_some_and(|h| h.message.is_some() || h.supersedes);
        let entry = Held { receipt: receipt.clone(), message, supersedes, received: std::time::Instant::now() };
        held.insert(id.clone(), entry);
        drop(held);
        // The effect ledger is not the queue: the worker asks it.
        Some(Claimed { job, lease: Lease { job_id: JobId(id), token: receipt }, begun: None })
    }
}

impl Enqueue for SqsBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        // FIFO: SQS drops a copy with the same key for five minutes.
        let dedupe = job.dedupe_id();
        Ok(Enqueued::Created(self.send(&job, dedupe, "send").await?))
    }

    /// Sends in batches of up to ten that SQS accepts (attributes counted). SQS may refuse some
    /// messages of a batch and take the rest; the refused ones are sent again (a few times, with
    /// backoff), never the taken ones. If some still fail, the error names the keys not sent and
    /// how many were: enqueue only those again, or the sent ones would be sent twice (the effect
    /// ledger would still keep their effects to one).
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        // Every message is checked before the first is sent.
        let messages = jobs.iter().map(|job| self.outgoing(job)).collect::<Result<Vec<_>>>()?;
        let sizes: Vec<usize> = messages.iter().map(|(body, attrs)| message_size(body, attrs)).collect();
        let mut sent: Vec<Option<String>> = vec![None; jobs.len()];
        let backoff = redrive_core::Backoff {
            base: Duration::from_millis(100),
            factor: 3.0,
            max: Duration::from_secs(3),
            jitter: true,
        };
        for range in batches(&sizes, self.inner.source.max_message_size) {
            let mut pending: Vec<usize> = range.collect();
            let mut refusal = String::new();
            for tries in 1..=BATCH_TRIES {
                let entries = pending.iter().map(|&i| {
                    let (body, attrs) = &messages[i];
                    let mut entry = SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .set_message_attributes(Some(attrs.clone()))
                        // Measured at each try: a job sent again after a backoff waits less.
                        .set_delay_seconds(self.send_delay(&jobs[i]));
                    if self.inner.source.fifo {
                        entry =
                            entry.message_group_id(jobs[i].key.as_str()).message_deduplication_id(jobs[i].dedupe_id());
                    }
                    entry.build().expect("id and body are set")
                });
                let out = match self
                    .inner
                    .client
                    .send_message_batch()
                    .queue_url(&self.inner.source.url)
                    .set_entries(Some(entries.collect()))
                    .send()
                    .await
                {
                    Ok(out) => out,
                    Err(e) => {
                        // No answer: this batch may or may not have been taken.
                        let why =
                            format!("{}; the outcome of its last batch is unknown", sdk(e, "send batch").message());
                        return Err(not_all_sent(&jobs, &sent, &why));
                    }
                };
                for ok in out.successful {
                    if let Ok(i) = ok.id.parse::<usize>() {
                        sent[i] = Some(ok.message_id);
                    }
                }
                pending.retain(|&i| sent[i].is_none());
                let permanent = out.failed.iter().any(|f| f.sender_fault);
                if let Some(failed) = out.failed.first() {
                    refusal = format!("{}: {}", failed.code, failed.message.as_deref().unwrap_or("no message"));
                }
                if pending.is_empty() || permanent {
                    break;
                }
                if tries < BATCH_TRIES {
                    tokio::time::sleep(backoff.delay(tries)).await;
                }
            }
            if !pending.is_empty() {
                return Err(not_all_sent(&jobs, &sent, &refusal));
            }
        }
        Ok(sent.into_iter().map(|id| Enqueued::Created(JobId(id.unwrap_or_default()))).collect())
    }
}

/// Sends of one batch's refused messages, the first included.
const BATCH_TRIES: u32 = 4;

/// A batch enqueue that stopped part-way: which keys were not sent, and how many jobs were.
fn not_all_sent(jobs: &[NewJob], sent: &[Option<String>], why: &str) -> Error {
    let sent: Vec<bool> = sent.iter().map(Option::is_some).collect();
    redrive_core::broker::not_all_sent("sqs", jobs, &sent, why, (ErrorKind::Backend, redrive_core::Retry::Temporary))
}

impl Backend for SqsBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dedupe: if self.inner.source.fifo { Dedupe::Window(Duration::from_secs(300)) } else { Dedupe::None },
            // What a message may hold beside what enqueue keeps room for: a payload this large
            // is accepted whenever its key and kind fit in the envelope's room.
            max_payload: self.max_message().saturating_sub(COPY_ROOM + HISTORY_ROOM + ENVELOPE_ROOM),
            max_claim: 10,
            atomic_batch: false,
            // SQS counts receives and gives none back: not on a release, nor when the worker
            // holding the message dies before its handler started.
            release_refunds: false,
            crash_refunds: false,
            claim_by_kind: false,
            min_lease: Duration::from_secs(1),
            // Standard queues send a scheduled job with `DelaySeconds`, up to 15 minutes; a later
            // one comes early and the worker puts it back (deferrals of 15 minutes at most). FIFO
            // queues refuse a per-message delay: there the worker does all the waiting.
            max_delay: (!self.inner.source.fifo).then_some(MAX_DELAY),
        }
    }
}

impl Claim for SqsBackend {
    /// SQS cannot receive by kind: `kinds` is ignored, and the worker defers what it has no
    /// handler for.
    async fn claim(&self, _kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let long_poll = wait.min(self.inner.max_wait);
        let out = self
            .inner
            .client
            .receive_message()
            .queue_url(&self.inner.source.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .wait_time_seconds(long_poll.as_secs() as i32)
            .visibility_timeout(secs(lease))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk(e, "receive"))?;
        let claimed: Vec<_> =
            out.messages.unwrap_or_default().into_iter().filter_map(|m| self.claimed_from(m)).collect();
        if claimed.is_empty() && long_poll < wait {
            // Short polling: honour the caller's wait here rather than have it ask again at once.
            tokio::time::sleep(wait - long_poll).await;
        }
        Ok(claimed)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        self.fence(lease)?;
        self.inner.deleter.delete(lease.token.clone()).await?;
        self.forget(lease);
        Ok(())
    }

    /// Like a deferral, a copy sent with the delay and the original deleted, but this attempt
    /// counted and its error added to the history the copy carries (`redrive-errors`), so that
    /// the record keeps every failed attempt. FIFO queues, and delays over SQS's 15 minutes, wait
    /// out the visibility instead: the attempt is counted, its error only logged.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        self.fence(lease)?;
        if self.inner.source.fifo || delay > MAX_DELAY {
            // The entry stays: this receipt fences an older one until the message is deleted.
            return self.hand_back(lease, delay, "retry").await;
        }
        let Some(Kept { body, mut attrs, attempt }) = self.take_message(lease) else {
            return self.set_visibility(lease, delay, "retry").await;
        };
        attrs.insert(ATTR_SPENT.to_owned(), string_attr(&attempt.to_string()));
        attrs.entry(ATTR_JOB_ID.to_owned()).or_insert_with(|| string_attr(&lease.job_id.0));
        let errors = history(&attrs, attempt, error);
        attrs.insert(ATTR_ERRORS.to_owned(), string_attr(&errors));
        self.replace_by_copy(lease, body, attrs, delay, "send the retried copy").await
    }

    /// A copy of the message, with the attempts spent before this receive, is sent with the
    /// delay, then the original is deleted: the copy's receive count starts afresh, so no number
    /// of deferrals reaches `maxReceiveCount`. FIFO queues refuse a per-message delay: there the
    /// message waits out its visibility instead, and this receive stays counted.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.fence(lease)?;
        if self.inner.source.fifo {
            return self.hand_back(lease, delay, "defer").await;
        }
        let Some(Kept { body, mut attrs, attempt }) = self.take_message(lease) else {
            // Only an entry dropped for age (a lease held past HELD_FOR among HELD_MAX others).
            warn!(message = %lease.job_id, "the deferred message is no longer held here; it waits out its visibility, counted");
            return self.set_visibility(lease, delay, "defer").await;
        };
        // The receive being deferred is given back: the copy has spent one less than this attempt.
        attrs.insert(ATTR_SPENT.to_owned(), string_attr(&attempt.saturating_sub(1).to_string()));
        attrs.entry(ATTR_JOB_ID.to_owned()).or_insert_with(|| string_attr(&lease.job_id.0));
        self.replace_by_copy(lease, body, attrs, delay.min(MAX_DELAY), "send the deferred copy").await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        // The receive count cannot be undone: the attempt stays counted.
        self.hand_back(lease, Duration::ZERO, "release").await
    }

    /// The record goes to the store (under the message's id, so that a repeat keeps it once),
    /// then the message is deleted. With the store down, the message goes to the DLQ with the
    /// record as attributes instead, and is drained into the store later.
    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let lease = &claimed.lease;
        self.fence(lease)?;
        let job = &claimed.job;
        // The message as received: the failed attempts it carries, and its body (a producer's
        // unknown fields, or a body that is not an envelope), re-encoded only when the entry is gone.
        let (kept_body, carried) = {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            let kept = held.get(&lease.job_id.0).and_then(|h| h.message.as_ref().map(|k| (h, k)));
            (
                kept.filter(|(h, _)| h.receipt == lease.token).map(|(_, k)| k.body.clone()),
                kept.map(|(_, k)| k.attrs.clone()).unwrap_or_default(),
            )
        };
        let now = Utc::now();
        let errors = history(&carried, job.attempt, error);
        let record = FailureRecord {
            id: FailureId(lease.job_id.0.clone()),
            job_id: job.id.clone(),
            kind: job.kind.clone(),
            key: job.key.clone(),
            provider_key: job.provider_key,
            payload: job.payload.clone(),
            // Cleaned (a terminal or SQS would choke on control characters) and cut; the rest
            // is in the worker's log.
            last_error: redrive_core::broker::last_error(error),
            first_failed_at: carried_errors(Some(&carried)).first().map_or(now, |e| e.at),
            errors: serde_json::from_str(&errors).unwrap_or_default(),
            attempts: job.attempt,
            cap: job.cap,
            severity: job.severity,
            last_failed_at: now,
            state: RecordState::Open,
        };
        if let Err(e) = self.inner.records.keep_records(&self.inner.scope, std::slice::from_ref(&record)).await {
            redrive_core::broker::store_down(job, &e);
            let body = kept_body.unwrap_or_else(|| {
                Envelope {
                    v: redrive_core::envelope::ENVELOPE_VERSION,
                    kind: job.kind.clone(),
                    key: job.key.clone(),
                    provider_key: job.provider_key,
                    cap: job.cap,
                    severity: job.severity,
                    enqueued_at: job.enqueued_at,
                    deadline: job.deadline,
                    not_before: job.not_before,
                    payload: job.payload.clone(),
                }
                .encode()
            });
            self.send_record_to_dlq(lease, &job.id, body, &record, &errors).await?;
        }
        // Then off the source. Not atomic: if this delete fails, the message comes back and is
        // dead-lettered again under the same record id, which keeps it once.
        self.inner
            .client
            .delete_message()
            .queue_url(&self.inner.source.url)
            .receipt_handle(&lease.token)
            .send()
            .await
            .map_err(|e| sdk(e, "delete the dead-lettered message"))?;
        self.forget(lease);
        Ok(Some(record))
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for SqsBackend {
    /// `ChangeMessageVisibility`; the receipt handle stays the same.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.set_visibility(lease, by, "extend visibility").await?;
        Ok(lease.clone())
    }
}

impl QueueStats for SqsBackend {
    /// SQS's approximate counts of the source queue (on AWS they may lag by a minute). A message
    /// waiting out a retry's delay is invisible, so it counts as running; a message sent with a
    /// delay counts as queued and scheduled. SQS has no age of the oldest message in its API
    /// (it is a CloudWatch metric), so `oldest_ready` is `None`.
    async fn counts(&self) -> Result<Counts> {
        let out = self
            .inner
            .client
            .get_queue_attributes()
            .queue_url(&self.inner.source.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|e| sdk(e, "read queue counts"))?;
        let attrs = out.attributes.unwrap_or_default();
        let count = |name: QueueAttributeName| attrs.get(&name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let delayed = count(QueueAttributeName::ApproximateNumberOfMessagesDelayed);
        Ok(Counts {
            queued: count(QueueAttributeName::ApproximateNumberOfMessages) + delayed,
            running: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            scheduled: Some(delayed),
            oldest_ready: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_count_attributes_and_keep_ten_at_most() {
        // Bodies alone would fit one batch; their attributes push it over the limit.
        assert_eq!(batches(&[400, 400, 400], 1000), [0..2, 2..3]);
        assert_eq!(batches(&[1000, 1, 1], 1000), [0..1, 1..3], "a message at the limit goes alone");
        assert_eq!(batches(&[1; 25], 1000), [0..10, 10..20, 20..25]);
        assert!(batches(&[], 1000).is_empty());
    }

    #[test]
    fn a_batch_stopped_part_way_names_what_was_not_sent() {
        let jobs: Vec<NewJob> = (0..25)
            .map(|n| {
                let key = IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
                NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
            })
            .collect();
        let mut sent: Vec<Option<String>> = (0..25).map(|n| Some(format!("m-{n}"))).collect();
        sent[3] = None;
        for s in &mut sent[5..] {
            *s = None;
        }
        let err = not_all_sent(&jobs, &sent, "InternalError: try again");
        assert_eq!(err.retry(), redrive_core::Retry::Temporary);
        let text = err.message();
        assert!(text.starts_with("sqs: 4 of 25 jobs were sent; not sent (InternalError: try again): "), "{text}");
        assert!(text.contains("ship:parcel=3, ship:parcel=5,") && text.contains(" and 1 more;"), "{text}");
        assert!(!text.contains("ship:parcel=0,"), "{text}");
    }

    #[test]
    fn queue_names_follow_sqs_rules() {
        for ok in ["jobs", "jobs-dlq", "a_b-9.fifo", &"q".repeat(80)] {
            assert!(check_queue_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".fifo", "with space", "dots.in.name", &"q".repeat(81)] {
            assert_eq!(check_queue_name(bad).unwrap_err().kind(), ErrorKind::InvalidName, "{bad}");
        }
    }

    #[test]
    fn a_body_that_is_not_an_envelope_is_carried_as_it_is() {
        let (env, undecodable) = carried_job("m-1", "<xml/>", None, Utc::now());
        let why = undecodable.expect("not an envelope");
        assert!(why.starts_with("the message body is not a redrive envelope: "), "{why}");
        assert!(!why.contains("xml"), "the body is not quoted: {why}");
        assert_eq!((env.key.as_str(), env.cap), ("sqs:message=m-1", 1));
        assert_eq!(env.payload, Value::String("<xml/>".into()));
    }

    #[test]
    fn a_deferred_copy_adds_its_spent_attempts_to_its_receives() {
        let with = |v: &str| HashMap::from([(ATTR_SPENT.to_owned(), string_attr(v))]);
        assert_eq!(spent(&HashMap::new()), 0, "never deferred");
        assert_eq!(spent(&with("3")), 3);
        assert_eq!(spent(&with("not a number")), 0, "a producer's garbage costs no attempts");
        let widest = string_attr(&u32::MAX.to_string());
        assert!(COPY_ROOM >= ATTR_SPENT.len() + 6 + widest.string_value().unwrap().len(), "enqueue keeps room for it");
        assert!(mentions("{}", Some(&with("7")), "7") && !mentions("{}", Some(&with("7")), "8"));
    }

    #[test]
    fn every_attribute_is_documented_for_producers() {
        let doc = include_str!("../../../docs/envelope.md");
        for name in [
            ATTR_KIND,
            ATTR_KEY,
            ATTR_PROVIDER_KEY,
            ATTR_ERROR,
            ATTR_ATTEMPTS,
            ATTR_FAILED_AT,
            ATTR_SOURCE_ID,
            ATTR_SPENT,
            ATTR_ERRORS,
            ATTR_JOB_ID,
        ] {
            assert!(doc.contains(&format!("| `{name}` |")), "docs/envelope.md does not name the attribute {name}");
        }
    }

    #[test]
    fn sdk_error_codes_map_to_kinds() {
        use crate::error::classify;
        assert_eq!(classify(Some("ReceiptHandleIsInvalid")).0, ErrorKind::LeaseLost);
        assert_eq!(classify(Some("AWS.SimpleQueueService.NonExistentQueue")).0, ErrorKind::NotFound);
        assert_eq!(classify(Some("RequestThrottled")).1, redrive_core::Retry::Temporary);
    }
}
