//! `SqsBackend`: the redrive contracts on an SQS queue and its dead-letter queue, with the failure
//! records in a [`RecordStore`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use redrive_core::kit::broker::{BrokerCore, HISTORY_ROOM, Held};
use redrive_core::kit::{
    AttemptError, Backend, Capabilities, Claim, Claimed, Dedupe, Envelope, Kinds, Lease, RecordStore, Renew,
};
use redrive_core::{
    Counts, Enqueue, Enqueued, Error, ErrorKind, FailureId, FailureRecord, IdempotencyKey, JobId, NewJob, QueueStats,
    Result,
};
use serde_json::Value;
use tracing::warn;

mod alarm;
mod claim;
mod dead_letters;
mod doctor;
mod message;

use self::dead_letters::carried_job;
use self::message::*;

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
/// Receives of the source queue `SqsBackend::holds_text` makes: short polls sample the queue.
#[cfg(feature = "test-hooks")]
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
    core: BrokerCore,
    max_receive_count: u32,
    max_wait: Duration,
    /// The latest receipt this process got for each message it holds, by message id: SQS
    /// accepts an old receipt handle for some calls, so fencing within a process is done here.
    held: Held<Holding>,
    deleter: Deleter,
    requests: Arc<AtomicU64>,
}

/// What this process keeps of a message it holds.
struct Holding {
    /// The message as received, to send again on a deferral or to the DLQ. Dropped once the
    /// message is handed back by its visibility (retry, release), when the entry only fences.
    message: Option<Kept>,
    /// This receive took the message from a lease of this process that was not settled (its
    /// visibility lapsed under a running handler): the entry fences that lease even once a
    /// deferral has deleted the message, or its late settlement would act on a job now carried
    /// by the copy.
    supersedes: bool,
}

/// A held message's body and attributes, exactly as received. Never logged.
struct Kept {
    body: String,
    attrs: HashMap<String, MessageAttributeValue>,
    /// The attempt this receive is (receive count plus [`ATTR_SPENT`]).
    attempt: u32,
}

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
    /// Connects to an existing queue and checks its setup, refusing what would lose data: no
    /// redrive policy, a missing dead-letter queue, a DLQ that does not keep messages longer than
    /// the source or takes smaller ones, a record store that is not ready (run its migrations).
    /// `records` keeps the failure records: your database's, such as a migrated
    /// `redrive_postgres::PgBackend`.
    pub async fn connect(config: SqsConfig, records: impl RecordStore) -> Result<Self> {
        check_queue_name(&config.queue)?;
        let requests = Arc::new(AtomicU64::new(0));
        let client = config.client(&requests).await;
        let facts = doctor::Facts::read(&client, &config.queue).await?;
        if let Some(refusal) = facts.refusal() {
            return Err(refusal);
        }
        let max_receive_count = doctor::max_receive_count(&facts.source);
        let size = |a: &HashMap<QueueAttributeName, String>| {
            a.get(&QueueAttributeName::MaximumMessageSize).and_then(|v| v.parse::<usize>().ok()).unwrap_or(262_144)
        };
        let (source_url, attrs) = (facts.source_url, facts.source);
        let Some((dlq_url, dlq_attrs)) = facts.dlq else {
            return Err(config_error("the dead-letter queue does not exist"));
        };
        // Records are kept under the source queue's ARN: unique across regions and accounts.
        let scope = attrs.get(&QueueAttributeName::QueueArn).cloned().unwrap_or_else(|| source_url.clone());
        let core = BrokerCore::new(Arc::new(records), scope);
        core.check_store().await?;
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
                core,
                max_receive_count,
                max_wait: config.wait,
                client,
                held: Held::new(),
                deleter,
                requests,
            }),
        })
    }

    /// Creates (or finds) the source queue and its dead-letter queue with the redrive policy,
    /// then connects.
    pub async fn setup(config: SqsConfig, setup: QueueSetup, records: impl RecordStore) -> Result<Self> {
        check_queue_name(&config.queue)?;
        let requests = Arc::new(AtomicU64::new(0));
        let client = config.client(&requests).await;
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
        self.inner.core.scope()
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
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let held_here =
            self.inner.held.any(|h| h.message.as_ref().is_some_and(|k| mentions(&k.body, Some(&k.attrs), text)));
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
        redrive_core::kit::broker::drain(self).await?;
        self.inner.core.records().records_mention(self.inner.core.scope(), text).await
    }

    /// Replays stop between their send and closing the record, as a crash there would: a test
    /// aid for replays retried after such a failure.
    #[cfg(feature = "test-hooks")]
    pub fn fail_replays_after_send(&self, fail: bool) {
        self.inner.core.stop_replays_after_send(fail);
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
        job.check_fits(&self.capabilities())?;
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
    redrive_core::kit::broker::not_all_sent(
        "sqs",
        jobs,
        &sent,
        why,
        (ErrorKind::Backend, redrive_core::Retry::Temporary),
    )
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
            // Its redrive moves a failed job out of the way and the next runs: the caution about
            // dead-letter queues behind ordered delivery. Order per key is kept where claims can
            // see the earlier jobs (the databases).
            order_per_key: false,
            // Its effect ledger is kept apart from its records.
            amend_replay: false,
            // A queue's messages cannot be listed, nor one taken out by id.
            live_jobs: false,
            // A queue delivers in its own order, whatever a message says: a job of another
            // priority than 0 is refused, and the pattern is a queue per priority (RUNBOOK.md).
            priorities: false,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("aws_sqs")
    }

    /// The source queue's name, the last part of its URL.
    fn messaging_destination(&self) -> Option<String> {
        self.queue_url().rsplit('/').next().map(str::to_owned)
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
}
