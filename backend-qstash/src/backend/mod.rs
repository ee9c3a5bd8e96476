//! `QStashBackend`: the redrive contracts on QStash's push delivery. A delivery is parked here
//! until a worker's verdict answers it; the worker claims parked deliveries as it claims jobs
//! elsewhere, so handlers, keys and records are the same code as on every other backend.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::broker::{Broker, BrokerCore, Call, Drained, Lapse, Parked, not_all_sent};
use redrive_core::kit::{
    AttemptError, Backend, Capabilities, Claim, Claimed, Dedupe, Envelope, Kinds, Lease, RecordStore, Renew,
    payload_fingerprint,
};
use redrive_core::{
    Counts, Enqueue, Enqueued, Error, ErrorKind, FailureId, FailureQuery, JobId, NewJob, QueueStats, Result,
};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::DlqEntry;
use crate::api::{Api, BATCH, Outgoing};
use crate::config::QStashConfig;
use crate::dead::{self, COPIED_AT, Carried, ERRORS, FAILED_AT, JOB_ID, REPLAY_OF, SEAL, SPENT, Seal, UNCLAIMED};
use crate::flow::FlowHeaders;
use crate::signature::Verifier;

mod claim;
mod dead_letters;

/// Room kept in a message for the envelope's fields and the headers a copy adds (the error
/// history, base64url JSON, is the largest).
const MESSAGE_ROOM: usize = 16 * 1024;
/// How often, at most, the receiver reads the signing keys again after a rotation.
const KEYS_REFRESH: Duration = Duration::from_secs(60);
/// QStash's deduplication window: 10 minutes, as the API reference (the publish endpoint's
/// `Upstash-Deduplication-Id`: "published in the last 10 minutes") and the deduplication page
/// ("The deduplication window is 10 minutes") say. `@upstash/qstash`'s JSDoc says ids are stored
/// 90 days; the backend depends on neither end: it never publishes an id again to send anything
/// again, and reads QStash's `deduplicated` answer where it could (a DLQ retry).
const DEDUPE_WINDOW: Duration = Duration::from_secs(600);
/// How long the receiver remembers refusing a message past its park bound, so that QStash's
/// retries of it are not counted as attempts of the job.
const REFUSALS_KEPT: Duration = Duration::from_secs(3600);
/// The longest `Upstash-Not-Before` / `Upstash-Delay` the backend sends: QStash's plans allow 7
/// days at least.
const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// redrive on Upstash QStash. Clones share one client and one set of parked deliveries: mount
/// [`receiver`](Self::receiver) in the same process as the workers that claim from it.
#[derive(Clone)]
pub struct QStashBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) api: Api,
    pub(crate) config: QStashConfig,
    pub(crate) verifier: Verifier,
    core: BrokerCore,
    /// Deliveries parked here: waiting for a worker, or claimed.
    pub(crate) parked: Parked<Delivery, Verdict>,
    cursor: Mutex<Cursor>,
    /// When the signing keys were last read from QStash; `None` when the configuration gives
    /// them (then they are never replaced).
    keys_read: Option<Mutex<Option<Instant>>>,
    /// Seals the headers a copy carries.
    pub(crate) seal: Seal,
    /// Messages refused past the park bound, by message id: how many times, and when last.
    refused: Mutex<HashMap<String, (u32, Instant)>>,
    /// The kinds' limits as QStash's flow control, on every message published.
    pub(crate) flow: FlowHeaders,
}

/// Where a drain's listing of the DLQ stands.
enum Cursor {
    Start,
    At(String),
    End,
}

/// What a verified delivery keeps beside its job while it is parked.
pub(crate) struct Delivery {
    pub(crate) message_id: String,
    pub(crate) retried: u32,
    pub(crate) carried: Carried,
    /// The raw body, sent again by a copy.
    pub(crate) body: String,
}

/// A parked delivery: its job, its [`Delivery`], and where its verdict goes.
pub(crate) type Parcel = Call<Delivery, Verdict>;

/// The answer a parked delivery gets.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) non_retryable: bool,
    pub(crate) failed_at: Option<i64>,
    /// On a 489: the trace id the record keeps (`Redrive-Trace-Id`, kept in the entry's
    /// `responseHeader` as `Redrive-Failed-At` is).
    pub(crate) trace_id: Option<String>,
    pub(crate) body: String,
}

impl Verdict {
    pub(crate) fn ok() -> Self {
        Self {
            status: 200,
            retry_after: None,
            non_retryable: false,
            failed_at: None,
            trace_id: None,
            body: String::new(),
        }
    }

    pub(crate) fn again(status: u16, after: Duration, body: impl Into<String>) -> Self {
        Self {
            status,
            retry_after: Some(after),
            non_retryable: false,
            failed_at: None,
            trace_id: None,
            body: body.into(),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lease_lost() -> Error {
    Error::new(ErrorKind::LeaseLost, "the delivery's lease is no longer held: it lapsed or was settled")
}

fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A deduplication id made of `parts`, hashed as a job's is ([`NewJob::dedupe_id`]).
fn dedupe_of(parts: &[&str]) -> String {
    payload_fingerprint(&serde_json::json!(parts))
}

impl QStashBackend {
    /// Connects: checks the configuration, the token (`GET /v2/keys`; a refused token is a
    /// `Config` error here, not at the first publish) and the record store, and takes the signing
    /// keys from QStash unless the configuration gives them. `records` keeps the failure records
    /// (your database: `redrive-postgres` or `redrive-sqlite`), scoped to this destination.
    pub async fn connect(config: QStashConfig, records: Arc<dyn RecordStore>) -> Result<Self> {
        config.check()?;
        let api = Api::new(&config.api_url, &config.token, Duration::from_secs(30))?;
        let keys = api.signing_keys().await?;
        let keys = config.signing_keys.clone().unwrap_or(keys);
        let scope = format!("qstash:{}", config.destination);
        records.open_records(&scope).await?;
        let verifier = Verifier::new(keys, config.destination.clone(), config.leeway, config.clock.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                api,
                verifier,
                core: BrokerCore::new(records, scope),
                parked: Parked::new(config.max_parked),
                cursor: Mutex::new(Cursor::Start),
                keys_read: config.signing_keys.is_none().then(|| Mutex::new(None)),
                seal: Seal::new(&config.token),
                refused: Mutex::new(HashMap::new()),
                flow: FlowHeaders::new(config.flow.clone(), &config.destination),
                config,
            }),
        })
    }

    /// Reads the signing keys again after a delivery neither key verified: QStash rotated them
    /// (the next key became current, and a new next key was made). At most once a minute, so
    /// forged deliveries cannot make the receiver call QStash for each; never where the
    /// configuration gives the keys. Whether the keys were read.
    pub(crate) async fn refresh_keys(&self) -> bool {
        let Some(read) = &self.inner.keys_read else { return false };
        {
            let mut last = lock(read);
            if last.is_some_and(|at| at.elapsed() < KEYS_REFRESH) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match self.inner.api.signing_keys().await {
            Ok(keys) => {
                info!("signing keys read again from QStash after a delivery neither key verified");
                self.inner.verifier.replace_keys(keys);
                true
            }
            Err(e) => {
                warn!(error = %e, "the signing keys could not be read again from QStash");
                false
            }
        }
    }

    /// Publish and batch requests made so far (the benchmark's publishes per job).
    pub fn publish_requests(&self) -> u64 {
        self.inner.api.publishes.load(Ordering::Relaxed)
    }

    /// Deletes from QStash's DLQ the entries of `key`'s records, which QStash keeps, payload and
    /// all, until a purge; the number of records whose entry is gone. Forgetting a key here is
    /// this, then [`Forget::forget_key`](redrive_core::Forget::forget_key) on the records store:
    /// in that order, or a later drain of the DLQ would make the records again.
    pub async fn forget_dlq_entries(&self, key: &redrive_core::IdempotencyKey) -> Result<u64> {
        let query = redrive_core::FailureQuery::by_key(key.clone());
        let records = self.inner.core.records().records(self.inner.core.scope(), &query).await?;
        // A record's id is its DLQ entry's.
        let ids: Vec<String> = records.into_iter().map(|r| r.id.0).collect();
        if !ids.is_empty() {
            self.inner.api.dlq_delete(&ids).await?;
        }
        Ok(ids.len() as u64)
    }

    /// Whether `text` is in a record, a DLQ entry or a delivery parked here (a test aid: a purge
    /// forgets payloads).
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        if self.inner.parked.any(|d| d.body.contains(text)) {
            return Ok(true);
        }
        if self.inner.core.records().records_mention(self.inner.core.scope(), text).await? {
            return Ok(true);
        }
        let mut cursor = None;
        loop {
            let (entries, next) = self.dlq_page(cursor.as_deref()).await?;
            if entries.iter().any(|e| e.body.as_deref().is_some_and(|b| b.contains(text))) {
                return Ok(true);
            }
            match next {
                Some(next) if !entries.is_empty() => cursor = Some(next),
                _ => return Ok(false),
            }
        }
    }

    /// The headers every message carries: its retries, the delivery timeout, the body's type.
    fn common_headers(&self, retries: u32) -> Vec<(String, String)> {
        vec![
            ("Content-Type".into(), "application/json".into()),
            ("Upstash-Retries".into(), retries.to_string()),
            ("Upstash-Timeout".into(), format!("{}s", seconds(self.inner.config.delivery_timeout))),
        ]
    }

    /// A job's deduplication id on this destination: QStash's ids are the account's, and two
    /// apps (or staging and production) on one token enqueue the same keys.
    fn dedupe_id(&self, job: &NewJob) -> String {
        dedupe_of(&[&self.inner.config.destination, &job.dedupe_id()])
    }

    /// A job's first message: dedupe on the key and the payload's fingerprint, the cap as
    /// retries, its time if scheduled, its kind's flow control.
    async fn first_message(&self, job: &NewJob, dedupe: &str) -> Outgoing {
        let mut headers = self.common_headers(job.cap.saturating_sub(1));
        headers.push(("Upstash-Deduplication-Id".into(), dedupe.to_owned()));
        headers.extend(self.inner.flow.of(&job.kind).await);
        if let Some(at) = job.not_before.filter(|at| *at > Utc::now()) {
            // Whole seconds, rounded up: never delivered before the time asked.
            let secs = at.timestamp() + i64::from(at.timestamp_subsec_nanos() > 0);
            headers.push(("Upstash-Not-Before".into(), secs.to_string()));
        }
        Outgoing { headers, body: Envelope::new(job).encode() }
    }
}

impl Backend for QStashBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dedupe: Dedupe::Window(DEDUPE_WINDOW),
            max_payload: self.inner.config.max_message.saturating_sub(MESSAGE_ROOM),
            max_claim: 128,
            atomic_batch: false,
            release_refunds: true,
            crash_refunds: false,
            claim_by_kind: true,
            min_lease: Duration::from_millis(10),
            max_delay: Some(MAX_DELAY),
            // Its redrive moves a failed job out of the way and the next runs: the caution about
            // dead-letter queues behind ordered delivery. Order per key is kept where claims can
            // see the earlier jobs (the databases).
            order_per_key: false,
            // Its effect ledger is kept apart from its records.
            amend_replay: false,
            // Its messages cannot be listed, nor one taken out by id.
            live_jobs: false,
            // A queue delivers in its own order, whatever a message says: a job of another
            // priority than 0 is refused, and the pattern is a queue per priority (RUNBOOK.md).
            priorities: false,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("qstash")
    }

    /// The QStash queue it publishes through, if any. Not the destination URL: a URL may carry
    /// a secret in its query.
    fn messaging_destination(&self) -> Option<String> {
        self.inner.config.queue.clone()
    }
}

impl Enqueue for QStashBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        Broker::check_job(self, &job)?;
        let message = self.first_message(&job, &self.dedupe_id(&job)).await;
        let published =
            self.inner.api.publish(&self.inner.config.destination, self.inner.config.queue.as_deref(), message).await?;
        let id = JobId(published.message_id);
        Ok(if published.deduplicated { Enqueued::Duplicate { id, provider_key: None } } else { Enqueued::Created(id) })
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            Broker::check_job(self, job)?;
        }
        let mut answers = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(BATCH) {
            let mut messages = Vec::with_capacity(chunk.len());
            for job in chunk {
                messages.push(self.first_message(job, &self.dedupe_id(job)).await);
            }
            let published = match self
                .inner
                .api
                .batch(&self.inner.config.destination, self.inner.config.queue.as_deref(), messages)
                .await
            {
                Ok(published) if published.len() == chunk.len() => published,
                Ok(_) => return Err(Error::temporary("QStash batch publish: not one answer per message")),
                Err(e) => {
                    let sent: Vec<bool> = (0..jobs.len()).map(|i| i < answers.len()).collect();
                    return Err(not_all_sent("QStash", &jobs, &sent, e.message(), (e.kind(), e.retry())));
                }
            };
            answers.extend(published.into_iter().map(|p| {
                let id = JobId(p.message_id);
                if p.deduplicated { Enqueued::Duplicate { id, provider_key: None } } else { Enqueued::Created(id) }
            }));
        }
        Ok(answers)
    }
}

impl QueueStats for QStashBackend {
    /// This process's deliveries only: QStash holds the rest and does not count them.
    async fn counts(&self) -> Result<Counts> {
        let (waiting, claimed) = self.inner.parked.counts();
        Ok(Counts { queued: waiting as u64, running: claimed as u64, scheduled: None, oldest_ready: None })
    }
}

pub(crate) const FAILED_AT_HEADER: &str = FAILED_AT;
pub(crate) const TRACE_ID_HEADER: &str = dead::TRACE_ID;
