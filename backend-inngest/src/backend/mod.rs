//! `InngestBackend`: the redrive contracts on Inngest's runs. Each job is an event; Inngest runs
//! the queue's function for it by calling the serve endpoint, where the call is parked until a
//! worker's verdict answers it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::broker::{Broker, BrokerCore, Call, Parked, not_all_sent};
use redrive_core::kit::{Backend, Capabilities, Dedupe, Envelope, RecordStore, payload_fingerprint};
use redrive_core::{Counts, Enqueue, Enqueued, JobId, NewJob, QueueStats, Result};
use serde_json::{Value, json};
use tracing::info;

use crate::api::{Api, BATCH};
use crate::config::InngestConfig;

mod claim;
mod dead_letters;

/// Room kept in an event for its name, id and the envelope's fields.
const EVENT_ROOM: usize = 16 * 1024;
/// How long Inngest runs a function once for an event id: 24 hours.
const DEDUPE_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The longest sleep the backend asks for: 7 days, what every Inngest plan allows.
const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// redrive on Inngest. Clones share one client and one set of parked calls: mount
/// [`endpoint`](Self::endpoint) in the same process as the workers that claim from it.
#[derive(Clone)]
pub struct InngestBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) api: Api,
    pub(crate) config: InngestConfig,
    pub(crate) core: BrokerCore,
    /// Calls parked here: waiting for a worker, or claimed.
    pub(crate) parked: Parked<Parcel, Verdict>,
}

/// What a parked call keeps beside its job.
pub(crate) struct Parcel {
    /// The run: a failure record's id.
    pub(crate) run_id: String,
    /// The run so far.
    pub(crate) progress: crate::steps::Progress,
}

/// A parked call, its job and its [`Parcel`].
pub(crate) type ParkedCall = Call<Parcel, Verdict>;

/// The answer a parked call gets.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// 200: the run is complete.
    Done,
    /// 206 with a mark: the attempts spent, an error, the wait.
    Mark(crate::steps::Mark),
    /// 206 with a sleep: a mark's wait.
    Wait(Duration),
    /// 400 with `X-Inngest-No-Retry: true`: the run fails, with this error.
    Fail(String),
    /// 500 with `X-Inngest-No-Retry: false`: Inngest calls again, and that counts an attempt.
    Again(String),
}

impl InngestBackend {
    /// Connects: checks the configuration and the record store. `records` keeps the failure
    /// records (your database: `redrive-postgres` or `redrive-sqlite`), scoped to this app. Register the functions with [`sync`](Self::sync) or let Inngest's sync reach the
    /// endpoint.
    pub async fn connect(config: InngestConfig, records: Arc<dyn RecordStore>) -> Result<Self> {
        config.check()?;
        let api = Api::new(&config)?;
        let scope = format!("inngest:{}", config.app_id);
        let core = BrokerCore::new(records, scope);
        core.check_store().await?;
        Ok(Self { inner: Arc::new(Inner { api, parked: Parked::new(config.max_parked), config, core }) })
    }

    /// The settings it was connected with (another app beside it starts from them).
    pub fn config(&self) -> &InngestConfig {
        &self.inner.config
    }

    /// Registers the queue's function and its failure handler with Inngest (what the endpoint
    /// does when Inngest's sync reaches it).
    pub async fn sync(&self) -> Result<()> {
        let answer = self.inner.api.register(&self.functions()).await?;
        let modified = answer.get("modified").and_then(serde_json::Value::as_bool).unwrap_or(false);
        info!(modified, "Inngest functions registered");
        Ok(())
    }

    /// The app's registration: the queue's function, and its failure handler on
    /// `inngest/function.failed`.
    pub(crate) fn functions(&self) -> Value {
        let config = &self.inner.config;
        let step = |id: &str, retries: u32| {
            json!({ "step": { "id": "step", "name": "step",
                "runtime": { "type": "http", "url": format!("{}?fnId={id}&stepId=step", config.serve_url) },
                "retries": { "attempts": retries } } })
        };
        let (function, failure) = (config.function_id(), config.failure_id());
        json!({
            "url": config.serve_url,
            "v": "0.1",
            "deployType": "ping",
            "sdk": concat!("rust:redrive-inngest:v", env!("CARGO_PKG_VERSION")),
            "framework": "axum",
            "appName": config.app_id,
            "functions": [
                // At most as many calls in flight as the endpoint parks: past it a call would be
                // handed back at once, a call (and a sleep) spent for nothing.
                { "id": function, "name": "redrive jobs", "concurrency": [{ "limit": config.max_parked }],
                  "triggers": [{ "event": config.event_name() }], "steps": step(&function, config.retries) },
                { "id": failure, "name": "redrive jobs (failure)",
                  "triggers": [{ "event": "inngest/function.failed",
                                 "expression": format!("event.data.function_id == '{function}'") }],
                  "steps": step(&failure, 1) },
            ],
        })
    }

    /// Requests made to the event API so far (the benchmark's requests per job).
    pub fn event_requests(&self) -> u64 {
        self.inner.api.event_requests.load(Ordering::Relaxed)
    }

    /// Whether `text` is in a record or a call parked here (a test aid: a purge forgets payloads).
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        // A parked call's payload is its job's (a body that is not an envelope: the body itself).
        if self.inner.parked.any(|call| call.job.payload.to_string().contains(text)) {
            return Ok(true);
        }
        self.inner.core.records().records_mention(self.inner.core.scope(), text).await
    }

    /// A job's event id: the scope, the key and the payload's fingerprint, hashed. Inngest runs
    /// the function once for an id for 24 hours; two apps or queues on one account do not meet.
    fn event_id(&self, job: &NewJob) -> String {
        payload_fingerprint(&json!([self.inner.core.scope(), job.dedupe_id()]))
    }

    /// A job's event, under `id`.
    fn event(&self, job: &NewJob, id: &str) -> Value {
        let data: Value = serde_json::from_str(&Envelope::new(job).encode()).unwrap_or(Value::Null);
        json!({ "name": self.inner.config.event_name(), "id": id, "data": data, "ts": Utc::now().timestamp_millis() })
    }

    /// Sends `jobs` under `ids`, [`BATCH`] a request; the jobs' ids, or which were not sent.
    async fn send(&self, jobs: &[NewJob], ids: Vec<String>) -> Result<Vec<Enqueued>> {
        let mut answers = Vec::with_capacity(jobs.len());
        for (chunk, ids) in jobs.chunks(BATCH).zip(ids.chunks(BATCH)) {
            let events: Vec<Value> = chunk.iter().zip(ids).map(|(job, id)| self.event(job, id)).collect();
            if let Err(e) = self.inner.api.send(&events).await {
                if jobs.len() == 1 {
                    return Err(e);
                }
                let sent: Vec<bool> = (0..jobs.len()).map(|i| i < answers.len()).collect();
                return Err(not_all_sent("Inngest", jobs, &sent, e.message(), (e.kind(), e.retry())));
            }
            answers.extend(ids.iter().map(|id| Enqueued::Created(JobId(id.clone()))));
        }
        Ok(answers)
    }
}

impl Backend for InngestBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Inngest drops a second event with the id within 24 hours, and its event API answers
            // both alike.
            dedupe: Dedupe::Unreported(DEDUPE_WINDOW),
            max_payload: self.inner.config.max_event.saturating_sub(EVENT_ROOM),
            max_claim: 128,
            atomic_batch: false,
            release_refunds: true,
            // A killed process leaves its calls unanswered: Inngest calls again, an attempt each.
            crash_refunds: false,
            claim_by_kind: true,
            min_lease: Duration::from_millis(10),
            max_delay: Some(MAX_DELAY),
            order_per_key: false,
            amend_replay: false,
            live_jobs: false,
            priorities: false,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("inngest")
    }

    fn messaging_destination(&self) -> Option<String> {
        Some(self.inner.config.event_name())
    }
}

impl Enqueue for InngestBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        Broker::check_job(self, &job)?;
        let id = self.event_id(&job);
        Ok(self.send(std::slice::from_ref(&job), vec![id]).await?.remove(0))
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            Broker::check_job(self, job)?;
        }
        let ids = jobs.iter().map(|job| self.event_id(job)).collect();
        self.send(&jobs, ids).await
    }
}

impl QueueStats for InngestBackend {
    /// This process's calls only: Inngest holds the rest and does not count them here.
    async fn counts(&self) -> Result<Counts> {
        let (waiting, claimed) = self.inner.parked.counts();
        Ok(Counts { queued: waiting as u64, running: claimed as u64, scheduled: None, oldest_ready: None })
    }
}
