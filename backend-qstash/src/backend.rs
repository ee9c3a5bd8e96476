//! `QStashBackend`: the redrive contracts on QStash's push delivery. A delivery is parked here
//! until a worker's verdict answers it; the worker claims parked deliveries as it claims jobs
//! elsewhere, so handlers, keys and records are the same code as on every other backend.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use redrive_core::broker::{Broker, Drained, not_all_sent};
use redrive_core::{
    AttemptError, Backend, Capabilities, Claim, Claimed, Counts, Dedupe, Enqueue, Enqueued, Envelope, Error, ErrorKind,
    FailureId, FailureQuery, JobId, JobRecord, Kinds, Lease, NewJob, QueueStats, RecordStore, Renew, Result,
    payload_fingerprint,
};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::DlqEntry;
use crate::api::{Api, BATCH, Outgoing};
use crate::config::QStashConfig;
use crate::dead::{self, COPIED_AT, Carried, ERRORS, FAILED_AT, JOB_ID, SEAL, SPENT, Seal, UNCLAIMED};
use crate::signature::Verifier;

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
    records: Arc<dyn RecordStore>,
    scope: String,
    /// Deliveries no worker has claimed yet, oldest first.
    waiting: Mutex<VecDeque<Arc<Delivery>>>,
    arrived: Notify,
    /// Claimed deliveries by lease token.
    held: Mutex<HashMap<String, Arc<Delivery>>>,
    draining: tokio::sync::Mutex<()>,
    cursor: Mutex<Cursor>,
    /// When the signing keys were last read from QStash; `None` when the configuration gives
    /// them (then they are never replaced).
    keys_read: Option<Mutex<Option<Instant>>>,
    fail_after_replay_send: AtomicBool,
    /// Seals the headers a copy carries.
    pub(crate) seal: Seal,
    /// Deliveries whose request is open here: parked, claimed or being answered.
    pub(crate) parked: AtomicUsize,
    /// Messages refused past the park bound, by message id: how many times, and when last.
    refused: Mutex<HashMap<String, (u32, Instant)>>,
    /// The kinds this process's claims have asked for (`None` in the set's place: any kind).
    wanted: Mutex<Option<HashSet<String>>>,
}

/// Where a drain's listing of the DLQ stands.
enum Cursor {
    Start,
    At(String),
    End,
}

/// A verified delivery, parked until its verdict.
pub(crate) struct Delivery {
    pub(crate) job: JobRecord,
    pub(crate) message_id: String,
    pub(crate) retried: u32,
    pub(crate) carried: Carried,
    /// The raw body, sent again by a copy.
    pub(crate) body: String,
    /// When QStash stops waiting for the answer, less a margin to send it.
    pub(crate) answer_by: Instant,
    /// When, unclaimed, it goes back to QStash (the park limit, within `answer_by`).
    pub(crate) unclaimed_by: Instant,
    pub(crate) state: Mutex<State>,
    /// Told when the state changes, so the parked request looks at its deadline again.
    pub(crate) changed: Notify,
    pub(crate) verdict: Mutex<Option<oneshot::Sender<Verdict>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    Waiting,
    Claimed { token: String, until: Instant },
    Settled,
}

/// The answer a parked delivery gets.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) non_retryable: bool,
    pub(crate) failed_at: Option<i64>,
    pub(crate) body: String,
}

impl Verdict {
    pub(crate) fn ok() -> Self {
        Self { status: 200, retry_after: None, non_retryable: false, failed_at: None, body: String::new() }
    }

    pub(crate) fn again(status: u16, after: Duration, body: impl Into<String>) -> Self {
        Self { status, retry_after: Some(after), non_retryable: false, failed_at: None, body: body.into() }
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
                records,
                scope,
                waiting: Mutex::new(VecDeque::new()),
                arrived: Notify::new(),
                held: Mutex::new(HashMap::new()),
                draining: tokio::sync::Mutex::new(()),
                cursor: Mutex::new(Cursor::Start),
                keys_read: config.signing_keys.is_none().then(|| Mutex::new(None)),
                fail_after_replay_send: AtomicBool::new(false),
                seal: Seal::new(&config.token),
                parked: AtomicUsize::new(0),
                refused: Mutex::new(HashMap::new()),
                wanted: Mutex::new(Some(HashSet::new())),
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

    /// Whether `text` is in a record, a DLQ entry or a delivery parked here (a test aid: a purge
    /// forgets payloads).
    #[doc(hidden)]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let parked = |d: &Arc<Delivery>| d.body.contains(text);
        if lock(&self.inner.waiting).iter().any(parked) || lock(&self.inner.held).values().any(parked) {
            return Ok(true);
        }
        if self.inner.records.records_mention(&self.inner.scope, text).await? {
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

    /// A test aid: replays stop between their send and closing the record, as a crash would.
    #[doc(hidden)]
    pub fn fail_after_replay_send(&self, fail: bool) {
        self.inner.fail_after_replay_send.store(fail, Ordering::Relaxed);
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
    /// retries, its time if scheduled.
    fn first_message(&self, job: &NewJob, dedupe: &str) -> Outgoing {
        let mut headers = self.common_headers(job.cap.saturating_sub(1));
        headers.push(("Upstash-Deduplication-Id".into(), dedupe.to_owned()));
        if let Some(at) = job.not_before.filter(|at| *at > Utc::now()) {
            // Whole seconds, rounded up: never delivered before the time asked.
            let secs = at.timestamp() + i64::from(at.timestamp_subsec_nanos() > 0);
            headers.push(("Upstash-Not-Before".into(), secs.to_string()));
        }
        Outgoing { headers, body: Envelope::new(job).encode() }
    }

    /// Publishes the delivery's next copy after `delay`, carrying `spent` attempts, `errors` and
    /// `unclaimed` rounds, sealed: a retry, a deferral or a delivery handed back. Its
    /// deduplication id is the delivery's (message id and retry count): one delivery has one
    /// successor, so the same delivery made twice at once (one run, one deferred behind its
    /// hold) cannot fork the job into two chains.
    async fn publish_copy(
        &self,
        d: &Delivery,
        spent: u32,
        errors: &[AttemptError],
        unclaimed: u32,
        delay: Duration,
    ) -> Result<()> {
        if !Self::waits(d) {
            // QStash stopped waiting and delivers the message again: no second chain.
            return Err(lease_lost());
        }
        let mut headers = self.common_headers(d.job.cap.saturating_sub(1).saturating_sub(spent));
        let dedupe = dedupe_of(&[&d.message_id, &d.retried.to_string()]);
        headers.push(("Upstash-Deduplication-Id".into(), dedupe));
        let delay = delay.min(MAX_DELAY);
        if delay >= Duration::from_millis(500) {
            headers.push(("Upstash-Delay".into(), format!("{}s", seconds(delay))));
        }
        let forward = |name: &str| format!("Upstash-Forward-{name}");
        let errors = if errors.is_empty() { String::new() } else { dead::encode_errors(errors) };
        let carried = [d.job.id.0.clone(), spent.to_string(), errors, unclaimed.to_string()];
        headers.push((forward(SEAL), self.inner.seal.sign(&carried, d.body.as_bytes())));
        for (name, value) in [JOB_ID, SPENT, ERRORS, UNCLAIMED].into_iter().zip(carried) {
            if !value.is_empty() {
                headers.push((forward(name), value));
            }
        }
        headers.push((forward(COPIED_AT), Utc::now().timestamp_millis().to_string()));
        let message = Outgoing { headers, body: d.body.clone() };
        self.inner.api.publish(&self.inner.config.destination, self.inner.config.queue.as_deref(), message).await?;
        Ok(())
    }

    /// The claimed delivery `lease` names, now settled: no other settlement or lapse can take it.
    fn settle(&self, lease: &Lease) -> Result<Arc<Delivery>> {
        let delivery = lock(&self.inner.held).remove(&lease.token).ok_or_else(lease_lost)?;
        let mut state = lock(&delivery.state);
        match &*state {
            State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                *state = State::Settled;
                drop(state);
                Ok(delivery)
            }
            _ => Err(lease_lost()),
        }
    }

    /// Whether the delivery's request still waits for its answer.
    fn waits(delivery: &Delivery) -> bool {
        lock(&delivery.verdict).as_ref().is_some_and(|sender| !sender.is_closed())
    }

    fn answer(delivery: &Delivery, verdict: Verdict) -> Result<()> {
        let sender = lock(&delivery.verdict).take().ok_or_else(lease_lost)?;
        // QStash stopped waiting (or the connection dropped): it delivers the message again.
        sender.send(verdict).map_err(|_| lease_lost())
    }

    /// Parks a verified delivery for the workers; called by the receiver.
    pub(crate) fn park(&self, delivery: Arc<Delivery>) {
        lock(&self.inner.waiting).push_back(delivery);
        self.inner.arrived.notify_waiters();
    }

    /// What a parked delivery whose time ran out is answered, if its time did run out: one no
    /// worker claimed goes back to QStash as a copy at no attempt's cost; one whose lease lapsed
    /// (its worker died or stalled) gets a 500, and QStash's retry counts the attempt.
    pub(crate) async fn lapse(&self, d: &Arc<Delivery>) -> Option<Verdict> {
        let now = Instant::now();
        let unclaimed = {
            // One lock order everywhere: `waiting`, then a delivery's `state`, then `held`.
            let mut waiting = lock(&self.inner.waiting);
            let mut state = lock(&d.state);
            let unclaimed = match &*state {
                State::Waiting if now >= d.unclaimed_by => {
                    waiting.retain(|w| !Arc::ptr_eq(w, d));
                    true
                }
                State::Claimed { token, until } if now >= *until => {
                    lock(&self.inner.held).remove(token);
                    false
                }
                _ => return None,
            };
            *state = State::Settled;
            unclaimed
        };
        if !unclaimed {
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt,
                "a claimed QStash delivery's lease lapsed; answered 500 for QStash to retry");
            return Some(Verdict::again(500, Duration::from_secs(1), "the worker's lease lapsed"));
        }
        let spent = d.job.attempt.saturating_sub(1);
        // A kind no claim of this process ever asked for would circulate for ever, billed each
        // round: counted, and past the bound a record. One left while its workers are busy is not.
        let unclaimed = if self.wanted(&d.job.kind) { d.carried.unclaimed } else { d.carried.unclaimed + 1 };
        if unclaimed >= self.inner.config.unclaimed_rounds {
            let error = format!(
                "no worker in this process handles kind {}: the delivery was handed back unclaimed {unclaimed} times",
                d.job.kind
            );
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, rounds = unclaimed,
                "a QStash delivery no worker here handles is dead-lettered as a record");
            return Some(Verdict {
                status: 489,
                retry_after: None,
                non_retryable: true,
                failed_at: Some(Utc::now().timestamp_millis()),
                body: redrive_core::broker::last_error(&error),
            });
        }
        // Delayed by the park limit: a kind no worker here handles comes back at that pace, not
        // at once in a loop of billed messages.
        let delay = self.inner.config.park_limit;
        Some(match self.publish_copy(d, spent, &d.carried.errors, unclaimed, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => Verdict::again(500, Duration::from_secs(1), "gone"),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, error = %e,
                    "no worker claimed a QStash delivery and its copy could not be sent; QStash retries it");
                Verdict::again(503, Duration::from_secs(1), "no worker was free")
            }
        })
    }

    /// Forgets a delivery whose request is gone (QStash, or a proxy in front, closed the
    /// connection): no worker claims it, and a claim of it can no longer settle.
    pub(crate) fn forget(&self, d: &Arc<Delivery>) {
        let mut waiting = lock(&self.inner.waiting);
        let mut state = lock(&d.state);
        match std::mem::replace(&mut *state, State::Settled) {
            State::Waiting => waiting.retain(|w| !Arc::ptr_eq(w, d)),
            State::Claimed { token, .. } => {
                lock(&self.inner.held).remove(&token);
            }
            State::Settled => return,
        }
        warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt,
            "a QStash delivery's connection closed before its verdict; QStash delivers it again");
    }

    /// Remembers the kinds a claim asks for: deliveries of others are unhandled here.
    fn want(&self, kinds: &Kinds) {
        let mut wanted = lock(&self.inner.wanted);
        match (kinds, wanted.as_mut()) {
            (Kinds::Any, _) => *wanted = None,
            (Kinds::Only(kinds), Some(set)) => set.extend(kinds.iter().cloned()),
            (Kinds::Only(_), None) => {}
        }
    }

    /// Whether a claim of this process ever asked for `kind`.
    fn wanted(&self, kind: &str) -> bool {
        lock(&self.inner.wanted).as_ref().is_none_or(|set| set.contains(kind))
    }

    /// Remembers a refusal of `message_id` past the park bound (an hour; the oldest forgotten
    /// first past 10,000 messages).
    pub(crate) fn note_refusal(&self, message_id: &str) {
        let mut refused = lock(&self.inner.refused);
        let now = Instant::now();
        if refused.len() >= 10_000 {
            refused.retain(|_, (_, at)| now.duration_since(*at) < REFUSALS_KEPT);
            if refused.len() >= 10_000 {
                let oldest = refused.iter().min_by_key(|(_, (_, at))| *at).map(|(id, _)| id.clone());
                refused.remove(&oldest.unwrap_or_default());
            }
        }
        let entry = refused.entry(message_id.to_owned()).or_insert((0, now));
        *entry = (entry.0 + 1, now);
    }

    /// How many of a message's deliveries this process refused past the park bound: QStash
    /// counted them as retries, no worker started them.
    pub(crate) fn refusals(&self, message_id: &str) -> u32 {
        lock(&self.inner.refused).get(message_id).filter(|(_, at)| at.elapsed() < REFUSALS_KEPT).map_or(0, |(n, _)| *n)
    }

    /// One page of this destination's DLQ entries. The list is asked for this destination only,
    /// and each entry is checked too: the DLQ is the account's, and another destination's
    /// entries are not this app's to read, alert on, discard or purge.
    async fn dlq_page(&self, cursor: Option<&str>) -> Result<(Vec<DlqEntry>, Option<String>)> {
        let (entries, next) = self.inner.api.dlq_page(&self.inner.config.destination, cursor).await?;
        Ok((entries.into_iter().filter(|e| self.ours(e)).collect(), next))
    }

    fn ours(&self, entry: &DlqEntry) -> bool {
        entry.url.as_deref() == Some(self.inner.config.destination.as_str())
    }

    /// The record's DLQ entry, if it is there and this destination's. A record kept before
    /// records were scoped (another destination's entry) is refused: its message is not this
    /// app's to send again or delete.
    async fn entry_of(&self, record: &FailureId) -> Result<Option<DlqEntry>> {
        match self.inner.api.dlq_get(&record.0).await {
            Ok(entry) if self.ours(&entry) => Ok(Some(entry)),
            Ok(_) => Err(Error::new(
                ErrorKind::NotFound,
                format!("DLQ entry {record} belongs to another destination on this QStash account"),
            )
            .with_retry(redrive_core::Retry::Permanent)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Publishes a replayed job from its record, under a deduplication id of the record's: not
    /// the job's (QStash would swallow it for its window), and one replay of the record sends
    /// one message however often it is tried.
    async fn republish(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        let dedupe = dedupe_of(&[&self.dedupe_id(job), &record.0]);
        let message = self.first_message(job, &dedupe);
        let published =
            self.inner.api.publish(&self.inner.config.destination, self.inner.config.queue.as_deref(), message).await?;
        Ok(JobId(published.message_id))
    }

    fn take(&self, kinds: &Kinds, max: usize, lease: Duration) -> Vec<Claimed> {
        let mut waiting = lock(&self.inner.waiting);
        let mut taken = Vec::new();
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() && taken.len() < max {
            let wanted = kinds.wants(&waiting[i].job.kind) || waiting[i].job.undecodable.is_some();
            if !wanted {
                i += 1;
                continue;
            }
            let d = waiting.remove(i).expect("within the queue");
            let token = uuid::Uuid::new_v4().to_string();
            // Only a waiting delivery is in the list: every change from waiting removes it, under
            // this lock.
            *lock(&d.state) = State::Claimed { token: token.clone(), until: (now + lease).min(d.answer_by) };
            d.changed.notify_one();
            lock(&self.inner.held).insert(token.clone(), d.clone());
            taken.push(Claimed { job: d.job.clone(), lease: Lease { job_id: d.job.id.clone(), token }, begun: None });
        }
        taken
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
        }
    }
}

impl Enqueue for QStashBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        Broker::check_job(self, &job)?;
        let message = self.first_message(&job, &self.dedupe_id(&job));
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
            let messages = chunk.iter().map(|j| self.first_message(j, &self.dedupe_id(j))).collect();
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

impl Claim for QStashBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        self.want(kinds);
        let deadline = Instant::now() + wait;
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let taken = self.take(kinds, max, lease);
            if !taken.is_empty() || Instant::now() >= deadline {
                return Ok(taken);
            }
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    async fn complete(&self, lease: &Lease, _result: Option<&serde_json::Value>) -> Result<()> {
        Self::answer(&*self.settle(lease)?, Verdict::ok())
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let d = self.settle(lease)?;
        let errors = redrive_core::broker::add_error(d.carried.errors.clone(), d.job.attempt, error);
        let verdict = match self.publish_copy(&d, d.job.attempt, &errors, 0, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(e),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt, error = %e,
                    "the retry's copy could not be published; QStash retries the delivery itself");
                Verdict::again(500, delay.max(Duration::from_secs(1)), redrive_core::broker::last_error(error))
            }
        };
        Self::answer(&d, verdict)
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let d = self.settle(lease)?;
        let spent = d.job.attempt.saturating_sub(1);
        let verdict = match self.publish_copy(&d, spent, &d.carried.errors, 0, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(e),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, error = %e,
                    "the deferral's copy could not be published; QStash retries the delivery itself");
                Verdict::again(503, delay.max(Duration::from_secs(1)), "deferred")
            }
        };
        Self::answer(&d, verdict)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let d = lock(&self.inner.held).get(&lease.token).cloned().ok_or_else(lease_lost)?;
        {
            let mut waiting = lock(&self.inner.waiting);
            let mut state = lock(&d.state);
            let current = matches!(&*state, State::Claimed { token, until }
                if *token == lease.token && Instant::now() <= *until);
            if !current || !Self::waits(&d) {
                return Err(lease_lost());
            }
            *state = State::Waiting;
            lock(&self.inner.held).remove(&lease.token);
            waiting.push_front(d.clone());
        }
        d.changed.notify_one();
        self.inner.arrived.notify_waiters();
        Ok(())
    }

    async fn dead_letter(&self, job: &Claimed, error: &str) -> Result<Option<redrive_core::FailureRecord>> {
        let d = self.settle(&job.lease)?;
        let verdict = Verdict {
            status: 489,
            retry_after: None,
            non_retryable: true,
            failed_at: Some(Utc::now().timestamp_millis()),
            body: redrive_core::broker::last_error(error),
        };
        Self::answer(&d, verdict)?;
        // QStash writes the DLQ entry and names it: the alert sweep finds the record there.
        Ok(None)
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for QStashBackend {
    /// Keeps the delivery parked `by` longer, up to QStash's delivery timeout: past it QStash has
    /// stopped waiting, and the effect ledger's hold keeps its next delivery from running twice.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        let d = lock(&self.inner.held).get(&lease.token).cloned().ok_or_else(lease_lost)?;
        {
            let mut state = lock(&d.state);
            match &mut *state {
                State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                    *until = (Instant::now() + by).min(d.answer_by);
                }
                _ => return Err(lease_lost()),
            }
        }
        d.changed.notify_one();
        Ok(lease.clone())
    }
}

impl QueueStats for QStashBackend {
    /// This process's deliveries only: QStash holds the rest and does not count them.
    async fn counts(&self) -> Result<Counts> {
        Ok(Counts {
            queued: lock(&self.inner.waiting).len() as u64,
            running: lock(&self.inner.held).len() as u64,
            scheduled: None,
            oldest_ready: None,
        })
    }
}

impl Broker for QStashBackend {
    fn record_store(&self) -> &dyn RecordStore {
        &*self.inner.records
    }

    fn record_scope(&self) -> &str {
        &self.inner.scope
    }

    /// The next page of this drain's listing of the DLQ (entries stay there while open, so a
    /// listing rather than a receive); empty at its end, and the next drain starts over.
    async fn receive_dead(&self, _hide: Duration) -> Result<Vec<Drained>> {
        let cursor = match std::mem::replace(&mut *lock(&self.inner.cursor), Cursor::Start) {
            Cursor::End => return Ok(Vec::new()),
            Cursor::Start => None,
            Cursor::At(cursor) => Some(cursor),
        };
        let mut cursor = cursor;
        let entries = loop {
            let (entries, next) = self.dlq_page(cursor.as_deref()).await?;
            match next {
                // A page of other destinations' entries only (a filter QStash did not apply).
                Some(next) if entries.is_empty() => cursor = Some(next),
                next => {
                    if !entries.is_empty() {
                        *lock(&self.inner.cursor) = next.map_or(Cursor::End, Cursor::At);
                    }
                    break entries;
                }
            }
        };
        Ok(entries.iter().map(|e| Drained { record: dead::record_of(e), receipt: e.dlq_id.clone() }).collect())
    }

    /// Nothing: an entry stays in the DLQ while its record is open, for QStash's retry API.
    async fn delete_dead(&self, _drained: &[Drained]) -> Result<()> {
        Ok(())
    }

    async fn show_dead_again(&self, _drained: &[Drained]) {
        *lock(&self.inner.cursor) = Cursor::Start;
    }

    fn check_job(&self, job: &NewJob) -> Result<()> {
        job.check_size(self.capabilities().max_payload)?;
        if job.cap.saturating_sub(1) > self.inner.config.max_retries {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "job {} has a cap of {} attempts; QStash retries at most {} times on this plan",
                    job.key, job.cap, self.inner.config.max_retries
                ),
            ));
        }
        Ok(())
    }

    /// QStash's retry API on the record's DLQ entry, once it is checked to be this
    /// destination's. An entry gone from the DLQ (deleted in the console, or past its
    /// retention) is published anew from the record; so is one whose retry QStash answers as
    /// deduplicated (the message's deduplication id still in its window: nothing was sent).
    async fn send_replay(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        let Some(entry) = self.entry_of(record).await? else {
            info!(record = %record, key = %job.key, "the DLQ entry is gone; the replay publishes the job from its record");
            return self.republish(job, record).await;
        };
        // The entry carries its last copy's attempts, history and retries: a replay starts over,
        // the job's id kept, sealed to the entry's body.
        let job_id = Carried::read(|name| dead::lookup(&entry.header, name)).job_id.unwrap_or(entry.message_id.clone());
        let carried = [job_id, "0".to_owned(), String::new(), String::new()];
        let seal = self.inner.seal.sign(&carried, dead::text(&entry.body, &entry.body_base64).as_bytes());
        let [job_id, spent, errors, unclaimed] = carried;
        let forward = |name: &str| format!("Upstash-Forward-{name}");
        let fresh = vec![
            ("Upstash-Retries".to_owned(), job.cap.saturating_sub(1).to_string()),
            (forward(JOB_ID), job_id),
            (forward(SPENT), spent),
            (forward(ERRORS), errors),
            (forward(UNCLAIMED), unclaimed),
            (forward(SEAL), seal),
            (forward(COPIED_AT), Utc::now().timestamp_millis().to_string()),
        ];
        match self.inner.api.dlq_retry(&record.0, fresh).await {
            Ok(sent) if !sent.deduplicated => Ok(JobId(sent.message_id)),
            Ok(_) => {
                info!(record = %record, key = %job.key,
                    "QStash answered the DLQ retry as deduplicated (nothing sent); the replay publishes the job from its record");
                let sent = self.republish(job, record).await?;
                // QStash removes a retried entry; one left would only be drained again.
                if let Err(e) = self.inner.api.dlq_delete(std::slice::from_ref(&record.0)).await
                    && e.kind() != ErrorKind::NotFound
                {
                    warn!(record = %record, error = %e, "the replayed record's DLQ entry could not be deleted");
                }
                Ok(sent)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                info!(record = %record, key = %job.key, "the DLQ entry is gone; the replay publishes the job from its record");
                self.republish(job, record).await
            }
            Err(e) => Err(e),
        }
    }

    fn drain_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.inner.draining
    }

    fn stop_after_replay_send(&self) -> bool {
        self.inner.fail_after_replay_send.load(Ordering::Relaxed)
    }

    /// Deletes the record's DLQ entry if it is this destination's; another's (a record kept
    /// before records were scoped) stays where it is.
    async fn forget_dead(&self, record: &FailureId) -> Result<()> {
        match self.entry_of(record).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                warn!(record = %record, "the record's DLQ entry is another destination's: it is left in the DLQ");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        match self.inner.api.dlq_delete(std::slice::from_ref(&record.0)).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes the DLQ entries of the records the store is about to purge (by the store's
    /// failure times, which are what the purge goes by), found in this destination's listing
    /// of the DLQ only.
    async fn purge_dead(&self, age: Duration) -> Result<()> {
        let before = Utc::now() - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX);
        let mut query = FailureQuery { failed_before: Some(before), limit: 500, ..FailureQuery::default() };
        let mut purged = HashSet::new();
        loop {
            let page = self.inner.records.records(&self.inner.scope, &query).await?;
            purged.extend(page.iter().map(|r| r.id.0.clone()));
            match page.last() {
                Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                _ => break,
            }
        }
        let mut cursor = None;
        while !purged.is_empty() {
            let (entries, next) = self.dlq_page(cursor.as_deref()).await?;
            let ids: Vec<String> = entries.into_iter().map(|e| e.dlq_id).filter(|id| purged.remove(id)).collect();
            if !ids.is_empty() {
                self.inner.api.dlq_delete(&ids).await?;
            }
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(())
    }
}

pub(crate) const FAILED_AT_HEADER: &str = FAILED_AT;
