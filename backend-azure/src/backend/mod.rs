//! `AzureBackend`: the redrive contracts on an Azure queue and its `-poison` queue, with the
//! failure records in a [`RecordStore`].

use std::sync::Arc;
use std::time::Duration;

use azure_core::http::headers::HeaderName;
use azure_storage_queue::QueueClient;
use azure_storage_queue::models::{
    QueueClientGetPropertiesResultHeaders, QueueClientReceiveMessagesOptions, QueueClientSendMessageOptions,
    QueueClientUpdateMessageOptions, QueueMessage, ReceivedMessage,
};
use chrono::{DateTime, Utc};
use redrive_core::kit::broker::{self, Broker, BrokerCore, Held};
use redrive_core::kit::{Backend, Capabilities, Claim, Claimed, Dedupe, Envelope, Kinds, Lease, RecordStore, Renew};
use redrive_core::{
    Counts, Enqueue, Enqueued, Error, ErrorKind, FailureId, FailureRecord, JobId, NewJob, QueueStats, RecordState,
    Result,
};
use serde_json::Value;
use tokio::sync::Mutex as AsyncMutex;
use tracing::warn;

use crate::config::{AzureConfig, QueueOptions, RequestCounts, ttl};
use crate::error::azure;
use crate::wire::{self, Carried, Text};

mod claim;
mod dead_letters;

/// The most messages one get returns (Azure's limit).
const MAX_GET: usize = 32;
/// The longest visibility Azure accepts (7 days).
const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// redrive on Azure Queue Storage: the queue carries the jobs; the failure records live in a
/// [`RecordStore`] (the application's database), and `<queue>-poison` is their fallback and
/// intake (records written while the store was down, messages other consumers such as the
/// Azure Functions trigger moved there). Clones share one client.
#[derive(Clone)]
pub struct AzureBackend {
    inner: Arc<Inner>,
}

struct Inner {
    queue: String,
    source: QueueClient,
    poison: QueueClient,
    options: QueueOptions,
    core: BrokerCore,
    /// The messages this process holds, by message id, with the pop receipts of their claim.
    held: Held<Holding>,
    /// A test aid: dead-lettering stops after the record is kept.
    #[cfg(feature = "test-hooks")]
    fail_after_record: std::sync::atomic::AtomicBool,
    requests: Arc<RequestCounts>,
}

/// A message held by this process. Every update (a renewal) gives a new pop receipt and voids
/// the old one, so the worker's lease may carry any receipt of this claim (the held table keeps
/// them): the current one is used, and calls on the message take turns, or a renewal racing a
/// delete would void the delete's receipt.
struct Holding {
    text: Text,
    attempt: u32,
    turn: Arc<AsyncMutex<()>>,
}

impl std::fmt::Debug for AzureBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureBackend").field("queue", &self.inner.queue).finish_non_exhaustive()
    }
}

/// The poison queue's name: Azure Functions' convention.
fn poison_name(queue: &str) -> String {
    format!("{queue}-poison")
}

impl AzureBackend {
    /// Connects to an existing queue and its `<queue>-poison` queue, refusing what cannot work:
    /// a key the account refuses (a clear error at once, no retries), a missing queue, a record
    /// store that is not ready (run its migrations). `records` keeps the failure records: your
    /// database's, such as a migrated `redrive_postgres::PgBackend`.
    pub async fn connect(
        config: &AzureConfig,
        queue: &str,
        options: QueueOptions,
        records: impl RecordStore,
    ) -> Result<Self> {
        let backend = Self::new(config, queue, options, records)?;
        backend.check().await?;
        Ok(backend)
    }

    /// Creates (or finds) the queue and its poison queue, then connects.
    pub async fn setup(
        config: &AzureConfig,
        queue: &str,
        options: QueueOptions,
        records: impl RecordStore,
    ) -> Result<Self> {
        let backend = Self::new(config, queue, options, records)?;
        for client in [&backend.inner.source, &backend.inner.poison] {
            client.create(None).await.map_err(|e| azure(e, "create the queue"))?;
        }
        backend.check().await?;
        Ok(backend)
    }

    async fn check(&self) -> Result<()> {
        for client in [&self.inner.source, &self.inner.poison] {
            client.get_properties(None).await.map_err(|e| azure(e, "read the queue's properties"))?;
        }
        self.inner.core.check_store().await
    }

    fn new(config: &AzureConfig, queue: &str, options: QueueOptions, records: impl RecordStore) -> Result<Self> {
        let requests = Arc::new(RequestCounts::default());
        let poison = poison_name(queue);
        crate::config::check_queue_name(queue)?;
        crate::config::check_queue_name(&poison)?;
        Ok(Self {
            inner: Arc::new(Inner {
                queue: queue.to_owned(),
                source: config.client(queue, Some(Arc::clone(&requests)))?,
                poison: config.client(&poison, Some(Arc::clone(&requests)))?,
                options,
                // Unique across accounts and endpoints sharing one store.
                core: BrokerCore::new(
                    Arc::new(records),
                    format!("azure:{}/{queue}", config.queue_endpoint().trim_end_matches('/')),
                ),
                held: Held::new(),
                #[cfg(feature = "test-hooks")]
                fail_after_record: std::sync::atomic::AtomicBool::new(false),
                requests,
            }),
        })
    }

    /// API requests sent so far (every HTTP try), for cost and efficiency figures.
    pub fn request_count(&self) -> u64 {
        self.inner.requests.total()
    }

    /// The requests sent so far, by what they do.
    pub fn requests(&self) -> &RequestCounts {
        &self.inner.requests
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.inner.queue
    }

    /// The poison queue's name: `<queue>-poison`.
    pub fn poison_queue_name(&self) -> String {
        poison_name(&self.inner.queue)
    }

    /// The name this queue's records have in the [`RecordStore`]: `azure:<endpoint>/<queue>`.
    pub fn record_scope(&self) -> &str {
        self.inner.core.scope()
    }

    /// Whether `text` appears in a message of the queue or the poison queue, in a failure
    /// record, or in a message this process holds. A test aid (a purge forgets payloads): the
    /// queues are peeked (32 visible messages each); the poison queue is drained first.
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        if self.inner.held.any(|h| h.text.body.contains(text)) {
            return Ok(true);
        }
        broker::drain(self).await?;
        for client in [&self.inner.source, &self.inner.poison] {
            let options = azure_storage_queue::models::QueueClientPeekMessagesOptions {
                number_of_messages: Some(32),
                ..Default::default()
            };
            let peeked = client.peek_messages(Some(options)).await.map_err(|e| azure(e, "peek"))?;
            let peeked = peeked.into_model().map_err(|e| azure(e, "read peeked messages"))?;
            let texts = peeked.items.unwrap_or_default().into_iter().filter_map(|m| m.message_text);
            if texts.map(|t| Text::read(&t)).any(|t| t.body.contains(text)) {
                return Ok(true);
            }
        }
        self.inner.core.records().records_mention(self.inner.core.scope(), text).await
    }

    /// Dead-lettering stops after the record is kept and before the message is deleted, as a
    /// crash there would.
    #[cfg(feature = "test-hooks")]
    pub fn fail_dead_letters_after_record(&self, fail: bool) {
        self.inner.fail_after_record.store(fail, std::sync::atomic::Ordering::Relaxed);
    }

    /// The text a job is sent as, checked against Azure's 64 KiB.
    fn outgoing(&self, job: &NewJob) -> Result<String> {
        let max = self.capabilities().max_payload;
        if job.payload_len() > max {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "job {} has a payload of {} bytes, over the {max} bytes a message has room for",
                    job.key,
                    job.payload_len()
                ),
            ));
        }
        job.check_fits(&self.capabilities())?;
        let body = Envelope::new(job).encode();
        let base64 = self.inner.options.base64;
        let text = wire::encode(&body, base64);
        wire::check_size(&format!("job {}", job.key), if base64 { &body } else { &text }, base64)?;
        Ok(text)
    }

    /// Sends `text` to `client`'s queue, kept `time_to_live` (`None`: never expires) and invisible
    /// for its first `hidden` seconds.
    async fn send(
        &self,
        client: &QueueClient,
        text: String,
        time_to_live: Option<Duration>,
        hidden: Option<i32>,
        what: &str,
    ) -> Result<JobId> {
        let message: azure_core::http::RequestContent<QueueMessage, azure_core::http::XmlFormat> =
            QueueMessage { message_text: Some(text) }.try_into().map_err(|e| azure(e, what))?;
        let options = QueueClientSendMessageOptions {
            message_time_to_live: Some(ttl(time_to_live)),
            visibility_timeout: hidden,
            ..Default::default()
        };
        let sent = client.send_message(message, Some(options)).await.map_err(|e| azure(e, what))?;
        // Azure took the message: an answer that does not parse must not read as "not sent" (a
        // replay would give its record back and send it twice).
        let sent = sent.into_model().and_then(|m| m.into_message()).map_err(|e| {
            Error::temporary(format!("azure: {what}: the message was sent, but its answer did not parse ({e})"))
        })?;
        Ok(JobId(sent.message_id.unwrap_or_default()))
    }

    /// The longest a job is sent invisible: Azure's 7 days, and less than the message's time to
    /// live (Azure refuses a visibility that outlasts the message).
    fn max_hidden(&self) -> Duration {
        match self.inner.options.time_to_live {
            Some(_) => {
                let lives = ttl(self.inner.options.time_to_live) as u64;
                MAX_VISIBILITY.min(Duration::from_secs(lives.saturating_sub(1)))
            }
            None => MAX_VISIBILITY,
        }
    }

    /// The initial visibility a job is sent with: the time to its `not_before`, rounded up to
    /// whole seconds so that it never arrives early, at most [`Self::max_hidden`] (a later job
    /// arrives early and the worker puts it back until its time, at no attempt's cost). `None`
    /// when it is due.
    fn send_delay(&self, job: &NewJob) -> Option<i32> {
        let wait = (job.not_before? - Utc::now()).to_std().ok()?;
        Some(wait.min(self.max_hidden()).as_secs_f64().ceil() as i32).filter(|&s| s > 0)
    }
}

impl Backend for AzureBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dedupe: Dedupe::None,
            max_payload: wire::max_body(self.inner.options.base64).saturating_sub(ENVELOPE_ROOM),
            max_claim: MAX_GET,
            atomic_batch: false,
            // A release writes the given-back receive into the message; a worker that dies
            // holding messages it had not started charges each of them an attempt.
            release_refunds: true,
            crash_refunds: false,
            claim_by_kind: false,
            min_lease: Duration::from_secs(1),
            // A scheduled job is sent invisible until its time, up to 7 days (less than the
            // message's time to live); a later one comes early and the worker puts it back.
            max_delay: Some(self.max_hidden()).filter(|d| !d.is_zero()),
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
        Some("azure_queue_storage")
    }

    fn messaging_destination(&self) -> Option<String> {
        Some(self.queue_name().to_owned())
    }
}

/// What an envelope adds around a payload (names, key, provider key, times), kept out of
/// [`Capabilities::max_payload`]; a key longer than this leaves less room, and enqueue says so.
const ENVELOPE_ROOM: usize = 1024;

impl Enqueue for AzureBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        let text = self.outgoing(&job)?;
        let (ttl, hidden) = (self.inner.options.time_to_live, self.send_delay(&job));
        Ok(Enqueued::Created(self.send(&self.inner.source, text, ttl, hidden, "send").await?))
    }

    /// Azure has no batch send: one request per job, a few at a time. Every job is checked
    /// before the first is sent; if a send fails, the error names the keys not sent.
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let texts = jobs.iter().map(|job| self.outgoing(job)).collect::<Result<Vec<_>>>()?;
        let mut sent: Vec<Option<JobId>> = vec![None; jobs.len()];
        let mut failure = None;
        let (ttl, texts) = (self.inner.options.time_to_live, &texts);
        for chunk in (0..jobs.len()).collect::<Vec<_>>().chunks(SENDS_AT_ONCE) {
            // Each job's delay is measured as its chunk goes: a later chunk waits less.
            let sends = chunk.iter().map(|&i| {
                let hidden = self.send_delay(&jobs[i]);
                async move { (i, self.send(&self.inner.source, texts[i].clone(), ttl, hidden, "send").await) }
            });
            for (i, result) in futures_util::future::join_all(sends).await {
                match result {
                    Ok(id) => sent[i] = Some(id),
                    Err(e) => failure = Some(e),
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(e) = failure {
            let sent: Vec<bool> = sent.iter().map(Option::is_some).collect();
            return Err(broker::not_all_sent("azure", &jobs, &sent, &e.to_string(), (e.kind(), e.retry())));
        }
        Ok(sent.into_iter().map(|id| Enqueued::Created(id.unwrap_or_else(|| JobId(String::new())))).collect())
    }
}

/// Sends of a batch enqueue in flight at once.
const SENDS_AT_ONCE: usize = 16;

impl QueueStats for AzureBackend {
    /// Azure's approximate message count, which counts invisible messages (running, waiting out
    /// a retry's delay or a deferral) with the visible ones: all are reported as queued.
    async fn counts(&self) -> Result<Counts> {
        let properties =
            self.inner.source.get_properties(None).await.map_err(|e| azure(e, "read the queue's properties"))?;
        let count = properties.approximate_messages_count().map_err(|e| azure(e, "read the message count"))?;
        Ok(Counts { queued: count.unwrap_or(0).max(0) as u64, ..Counts::default() })
    }
}
