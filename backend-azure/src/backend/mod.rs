//! `AzureBackend`: the redrive contracts on an Azure queue and its `-poison` queue, with the
//! failure records in a [`RecordStore`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core::http::headers::HeaderName;
use azure_storage_queue::QueueClient;
use azure_storage_queue::models::{
    QueueClientGetPropertiesResultHeaders, QueueClientPeekMessagesOptions, QueueClientReceiveMessagesOptions,
    QueueClientSendMessageOptions, QueueClientUpdateMessageOptions, QueueMessage, ReceivedMessage,
};
use chrono::{DateTime, Utc};
use redrive_core::broker::{self, Broker};
use redrive_core::{
    Backend, Capabilities, Claim, Claimed, Counts, Dedupe, Enqueue, Enqueued, Envelope, Error, ErrorKind, FailureId,
    FailureRecord, JobId, Kinds, Lease, NewJob, QueueStats, RecordState, RecordStore, Renew, Result,
};
use serde_json::Value;
use tokio::sync::Mutex as AsyncMutex;
use tracing::warn;

use crate::config::{AzureConfig, QueueOptions, RequestCounts, ttl};
use crate::error::azure;
use crate::wire::{self, Carried, Text};

mod records;

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
    records: Arc<dyn RecordStore>,
    scope: String,
    /// The messages this process holds: the pop receipts of their current claim, and their text.
    held: Mutex<HashMap<String, Held>>,
    draining: AsyncMutex<()>,
    /// Test aids: replays stop after their send; dead-lettering stops after the record is kept.
    fail_after_replay_send: AtomicBool,
    fail_after_record: AtomicBool,
    requests: Arc<RequestCounts>,
}

/// A message held by this process. Every update (a renewal) gives a new pop receipt and voids
/// the old one, so the worker's lease may carry any receipt of this claim: the current one is
/// used, and calls on the message take turns, or a renewal racing a delete would void the
/// delete's receipt.
struct Held {
    /// The pop receipts this claim was given: the first and the latest few, the current last.
    receipts: Vec<String>,
    text: Text,
    attempt: u32,
    turn: Arc<AsyncMutex<()>>,
    /// When the claim was last received or updated.
    received: std::time::Instant,
}

/// Receipts of one claim kept: its first (the worker's lease may still carry it) and the latest.
const RECEIPTS_KEPT: usize = 4;

/// Past this many held messages, entries untouched for [`HELD_FOR`] are dropped (a message
/// settled by another process would otherwise stay forever).
const HELD_MAX: usize = 10_000;
const HELD_FOR: Duration = Duration::from_secs(15 * 60);

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
        self.inner.records.open_records(&self.inner.scope).await.map_err(|e| {
            Error::new(e.kind(), format!("the failure record store is not ready (has it been migrated?): {e}"))
        })?;
        Ok(())
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
                records: Arc::new(records),
                // Unique across accounts and endpoints sharing one store.
                scope: format!("azure:{}/{queue}", config.queue_endpoint().trim_end_matches('/')),
                held: Mutex::default(),
                draining: AsyncMutex::new(()),
                fail_after_replay_send: AtomicBool::new(false),
                fail_after_record: AtomicBool::new(false),
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
        &self.inner.scope
    }

    /// Whether `text` appears in a message of the queue or the poison queue, in a failure
    /// record, or in a message this process holds. A test aid (a purge forgets payloads): the
    /// queues are peeked (32 visible messages each); the poison queue is drained first.
    #[doc(hidden)]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let held_here = {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            held.values().any(|h| h.text.body.contains(text))
        };
        if held_here {
            return Ok(true);
        }
        broker::drain(self).await?;
        for client in [&self.inner.source, &self.inner.poison] {
            let options = QueueClientPeekMessagesOptions { number_of_messages: Some(32), ..Default::default() };
            let peeked = client.peek_messages(Some(options)).await.map_err(|e| azure(e, "peek"))?;
            let peeked = peeked.into_model().map_err(|e| azure(e, "read peeked messages"))?;
            let texts = peeked.items.unwrap_or_default().into_iter().filter_map(|m| m.message_text);
            if texts.map(|t| Text::read(&t)).any(|t| t.body.contains(text)) {
                return Ok(true);
            }
        }
        self.inner.records.records_mention(&self.inner.scope, text).await
    }

    /// Replays stop between their send and closing the record, as a crash there would.
    #[doc(hidden)]
    pub fn fail_replays_after_send(&self, fail: bool) {
        self.inner.fail_after_replay_send.store(fail, Ordering::Relaxed);
    }

    /// Dead-lettering stops after the record is kept and before the message is deleted, as a
    /// crash there would.
    #[doc(hidden)]
    pub fn fail_dead_letters_after_record(&self, fail: bool) {
        self.inner.fail_after_record.store(fail, Ordering::Relaxed);
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

    /// The current pop receipt for `lease` and the message's turn: a receipt of this process's
    /// current claim stands for the latest; another (an older claim's) goes to Azure as it is,
    /// which refuses it if stale.
    fn receipt(&self, lease: &Lease) -> (String, Option<Arc<AsyncMutex<()>>>) {
        let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get(&lease.job_id.0) {
            Some(h) if h.receipts.contains(&lease.token) => {
                (h.receipts.last().cloned().unwrap_or_default(), Some(Arc::clone(&h.turn)))
            }
            _ => (lease.token.clone(), None),
        }
    }

    /// Waits for the message's turn, then gives its current pop receipt; calls on one message
    /// take turns.
    async fn take_turn(&self, lease: &Lease) -> (String, Option<tokio::sync::OwnedMutexGuard<()>>) {
        let guard = match self.receipt(lease).1 {
            Some(turn) => Some(turn.lock_owned().await),
            None => None,
        };
        (self.receipt(lease).0, guard)
    }

    /// Updates the message's visibility (and its text, if given) and returns the new pop
    /// receipt, remembered for the claim. The update runs on a task of its own that records the
    /// new receipt before it lets the next call on the message go: a caller that stops waiting
    /// (a renewal dropped because its handler finished) must not lose a receipt Azure has
    /// already swapped for the old one.
    async fn update(&self, lease: &Lease, visibility: Duration, text: Option<&Text>, what: &str) -> Result<String> {
        let (receipt, turn) = self.take_turn(lease).await;
        let backend = self.clone();
        let (lease, text, what) = (lease.clone(), text.map(|t| self.fitting(t)), what.to_owned());
        let update = tokio::spawn(async move {
            let _turn = turn;
            backend.update_now(&lease, &receipt, visibility, text.flatten(), &what).await
        });
        update.await.map_err(|_| Error::temporary("azure: the update's task stopped"))?
    }

    async fn update_now(
        &self,
        lease: &Lease,
        receipt: &str,
        visibility: Duration,
        text: Option<Text>,
        what: &str,
    ) -> Result<String> {
        let mut options = QueueClientUpdateMessageOptions::default();
        if let Some(text) = &text {
            let encoded = wire::encode(&text.body, self.inner.options.base64);
            options.queue_message =
                Some(QueueMessage { message_text: Some(encoded) }.try_into().map_err(|e| azure(e, what))?);
        }
        let seconds = visibility.min(MAX_VISIBILITY).as_secs_f64().ceil() as i32;
        let response = self
            .inner
            .source
            .update_message(&lease.job_id.0, receipt, seconds, Some(options))
            .await
            .map_err(|e| azure(e, what))?;
        let name = HeaderName::from_static("x-ms-popreceipt");
        let new = response
            .headers()
            .get_optional_str(&name)
            .map(str::to_owned)
            .ok_or_else(|| Error::temporary(format!("azure: {what} answered no pop receipt")))?;
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.get_mut(&lease.job_id.0).filter(|h| h.receipts.contains(&lease.token)) {
            // The claim's first receipt (the worker's lease) and the latest few stand for it.
            if h.receipts.len() >= RECEIPTS_KEPT {
                h.receipts.remove(1);
            }
            h.receipts.push(new.clone());
            h.received = std::time::Instant::now();
            if let Some(text) = text {
                h.text = text;
            }
        }
        Ok(new)
    }

    /// `text` as it fits in 64 KiB once encoded: whole, or without its error history (a
    /// producer's message near the limit), or not at all (the update then changes the visibility
    /// only, and the given-back receive is lost).
    fn fitting(&self, text: &Text) -> Option<Text> {
        let fits = |t: &Text| wire::encode(&t.body, self.inner.options.base64).len() <= wire::MAX_TEXT;
        if fits(text) {
            return Some(text.clone());
        }
        let lighter = text.with(Carried { errors: Vec::new(), ..text.carried.clone() });
        fits(&lighter).then_some(lighter)
    }

    /// Deletes the message behind `lease` from the source queue.
    async fn delete(&self, lease: &Lease, what: &str) -> Result<()> {
        let (receipt, _turn) = self.take_turn(lease).await;
        self.inner.source.delete_message(&lease.job_id.0, &receipt, None).await.map_err(|e| azure(e, what))?;
        self.forget(lease);
        Ok(())
    }

    /// Drops the held entry of the claim `lease` belongs to.
    fn forget(&self, lease: &Lease) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(&lease.job_id.0).is_some_and(|h| h.receipts.contains(&lease.token)) {
            held.remove(&lease.job_id.0);
        }
    }

    /// The held text and attempt of the claim `lease` belongs to.
    fn held_text(&self, lease: &Lease) -> Option<(Text, u32)> {
        let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&lease.job_id.0).filter(|h| h.receipts.contains(&lease.token)).map(|h| (h.text.clone(), h.attempt))
    }

    /// Hands the message back after `after`, its receive given back (a deferral, a release: the
    /// next receive is not a new attempt).
    async fn hand_back(&self, lease: &Lease, after: Duration, what: &str) -> Result<()> {
        let text = self.held_text(lease).map(|(text, _)| {
            let carried = Carried { given_back: text.carried.given_back + 1, ..text.carried.clone() };
            text.with(carried)
        });
        self.update(lease, after, text.as_ref(), what).await?;
        self.forget(lease);
        Ok(())
    }

    fn claimed_from(&self, m: ReceivedMessage) -> Option<Claimed> {
        let (id, receipt) = (m.message_id?, m.pop_receipt?);
        let text = Text::read(&m.message_text.unwrap_or_default());
        let dequeues = u32::try_from(m.dequeue_count.unwrap_or(1)).unwrap_or(u32::MAX).max(1);
        // Deferrals and releases give their receive back.
        let attempt = dequeues.saturating_sub(text.carried.given_back).max(1);
        let inserted = m
            .insertion_time
            .and_then(|t| DateTime::<Utc>::from_timestamp(t.unix_timestamp(), t.nanosecond()))
            .unwrap_or_else(Utc::now);
        // Not an envelope: handed over marked as such, so the worker records a decode failure
        // without looking for a handler, with the text kept for a person to read.
        let (env, undecodable) = text.job(&id, inserted);
        // Recorded already, and back because its delete failed: past the cap, so that the
        // worker records it again (kept once) rather than run it.
        let attempt = if text.carried.recorded { attempt.max(env.cap.saturating_add(1)) } else { attempt };
        let job = broker::job_record(JobId(id.clone()), env, attempt, undecodable);
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() >= HELD_MAX {
            held.retain(|_, h| h.received.elapsed() < HELD_FOR);
        }
        let entry = Held {
            receipts: vec![receipt.clone()],
            text,
            attempt,
            turn: Arc::default(),
            received: std::time::Instant::now(),
        };
        held.insert(id.clone(), entry);
        drop(held);
        Some(Claimed { job, lease: Lease { job_id: JobId(id), token: receipt }, begun: None })
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
        }
    }
}

/// What an envelope adds around a payload (names, key, provider key, times), kept out of
/// [`Capabilities::max_payload`]; a key longer than this leaves less room, and enqueue says so.
const ENVELOPE_ROOM: usize = 1024;

impl Claim for AzureBackend {
    /// Azure cannot get by kind: `kinds` is ignored, and the worker defers what it has no
    /// handler for. Azure has no long polling: an empty get waits out `wait` before it returns.
    async fn claim(&self, _kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(max.clamp(1, MAX_GET) as i32),
            visibility_timeout: Some(lease.min(MAX_VISIBILITY).as_secs_f64().ceil().max(1.0) as i32),
            ..Default::default()
        };
        let got = self.inner.source.receive_messages(Some(options)).await.map_err(|e| azure(e, "get messages"))?;
        let got = got.into_model().map_err(|e| azure(e, "read messages"))?;
        let claimed: Vec<_> = got.items.unwrap_or_default().into_iter().filter_map(|m| self.claimed_from(m)).collect();
        if claimed.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(claimed)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        self.delete(lease, "delete the finished message").await
    }

    /// The message waits out `delay` (up to Azure's 7 days) invisible, its text updated with
    /// this attempt's error, so that the record keeps every failed attempt.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let text = self.held_text(lease).map(|(text, attempt)| {
            let errors = broker::add_error(text.carried.errors.clone(), attempt, error);
            let carried = Carried { errors, ..text.carried.clone() };
            text.with(carried)
        });
        self.update(lease, delay, text.as_ref(), "retry").await?;
        self.forget(lease);
        Ok(())
    }

    /// The message waits out `delay` invisible (a longer one than 7 days comes back early and is
    /// deferred again); its text counts the receive as given back, so that no number of
    /// deferrals uses up attempts.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.hand_back(lease, delay, "defer").await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.hand_back(lease, Duration::ZERO, "release").await
    }

    /// The record goes to the store (under the message's id, so that a repeat keeps it once),
    /// then the message is deleted. With the store down, the record goes to the poison queue
    /// instead, and is drained into the store later. A crash between the two leaves the message
    /// to come back past its cap: the worker dead-letters it again without running it, and the
    /// store keeps its record once.
    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let (lease, job) = (&claimed.lease, &claimed.job);
        // Proves the lease is still this claim's (Azure refuses a stale pop receipt) before
        // anything is recorded, keeps the message hidden while the record is written, and marks
        // it recorded, should its delete fail and it come back before its cap.
        let marked =
            self.held_text(lease).map(|(text, _)| text.with(Carried { recorded: true, ..text.carried.clone() }));
        self.update(lease, RECORD_HIDE, marked.as_ref(), "hold the message while its record is kept").await?;
        let carried = self.held_text(lease).map(|(text, _)| text.carried.errors).unwrap_or_default();
        let now = Utc::now();
        let errors = broker::add_error(carried, job.attempt, error);
        let record = FailureRecord {
            id: FailureId(lease.job_id.0.clone()),
            job_id: job.id.clone(),
            kind: job.kind.clone(),
            key: job.key.clone(),
            provider_key: job.provider_key,
            payload: job.payload.clone(),
            last_error: broker::last_error(error),
            first_failed_at: errors.first().map_or(now, |e| e.at),
            errors,
            attempts: job.attempt,
            cap: job.cap,
            severity: job.severity,
            last_failed_at: now,
            state: RecordState::Open,
        };
        if let Err(e) = self.inner.records.keep_records(&self.inner.scope, std::slice::from_ref(&record)).await {
            broker::store_down(job, &e);
            let text = wire::poison_text(&record, self.inner.options.base64);
            let ttl = self.inner.options.poison_time_to_live;
            self.send(&self.inner.poison, text, ttl, None, "send to the poison queue").await?;
        }
        if self.inner.fail_after_record.load(Ordering::Relaxed) {
            return Err(Error::temporary("injected: dead-lettering stopped after the record was kept"));
        }
        // Then off the queue. Not atomic: if this delete fails, the message comes back past its
        // cap and is dead-lettered again under the same record id, which keeps it once.
        self.delete(lease, "delete the dead-lettered message").await?;
        Ok(Some(record))
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for AzureBackend {
    /// Update Message with the new visibility: Azure answers a new pop receipt, the new lease.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        let receipt = self.update(lease, by, None, "extend visibility").await?;
        Ok(Lease { job_id: lease.job_id.clone(), token: receipt })
    }
}

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

/// How long a message being dead-lettered stays hidden while its record is written.
const RECORD_HIDE: Duration = Duration::from_secs(60);

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
