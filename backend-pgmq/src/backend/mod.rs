//! `PgmqBackend`: the redrive contracts on a pgmq queue, in the database that keeps the failure
//! records and the effect ledger.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::broker::{self, BrokerCore, Held};
use redrive_core::kit::{AttemptError, Backend, Capabilities, Dedupe, Envelope};
use redrive_core::{Counts, Enqueue, Enqueued, Error, ErrorKind, JobId, NewJob, QueueStats, Result};
use redrive_postgres::PgBackend;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};

use crate::completer::Completer;
use crate::config::{PgmqConfig, check_queue_name};
use crate::error::db;
use crate::sql::{Sql, q};

mod claim;
mod dead_letters;
mod keys;

/// redrive on a pgmq queue: pgmq's table carries the jobs (read with a visibility timeout as the
/// lease, the read count as the attempt); the failure records and the effect ledger are the
/// [`PgBackend`] of the same database, so a record, its replay and a key's state stay beside the
/// queue. Clones share one pool.
#[derive(Clone)]
pub struct PgmqBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: PgmqConfig,
    pool: PgPool,
    sql: Sql,
    core: BrokerCore,
    /// The records store and ledger, whose transactions the dead letters share.
    records: PgBackend,
    /// The messages this process holds, by message id, with the read that holds them.
    held: Held<Holding>,
    /// Groups concurrent completions; started by the first (it needs a runtime).
    completer: OnceLock<Completer>,
}

/// A message held by this process: its headers as read (redrive's error history among them),
/// and the ledger's hold of the key, if its claim took one.
struct Holding {
    headers: Option<String>,
    attempt: u32,
    hold: Option<redrive_core::kit::Hold>,
}

/// What redrive keeps in a message's `headers` beside pgmq's: the failed attempts' errors, for
/// the record. Other keys a producer set are kept as they were.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Carried {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    errors: Vec<AttemptError>,
}

/// The headers' key redrive's part goes under.
const HEADER: &str = "redrive";

impl std::fmt::Debug for PgmqBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgmqBackend").field("queue", &self.inner.config.queue).finish_non_exhaustive()
    }
}

impl PgmqBackend {
    /// Connects to an existing pgmq queue in `records`' database, refusing what cannot work: pgmq
    /// not installed, the queue missing, `records` not migrated. `records` keeps the failure
    /// records and is the workers' effect ledger.
    pub async fn connect(config: PgmqConfig, records: PgBackend) -> Result<Self> {
        let backend = Self::new(config, records)?;
        backend.check().await?;
        Ok(backend)
    }

    /// Creates the queue with `pgmq.create` (nothing if it exists), then connects.
    pub async fn setup(config: PgmqConfig, records: PgBackend) -> Result<Self> {
        let backend = Self::new(config, records)?;
        backend.installed().await?;
        q(&backend.inner.sql.create)
            .bind(&backend.inner.config.queue)
            .execute(&backend.inner.pool)
            .await
            .map_err(|e| db(e, "create the queue"))?;
        backend.check().await?;
        Ok(backend)
    }

    fn new(config: PgmqConfig, records: PgBackend) -> Result<Self> {
        check_queue_name(&config.queue)?;
        let pool = records.pool().clone();
        let scope = format!("pgmq:{}.{}", records.schema(), config.queue);
        Ok(Self {
            inner: Arc::new(Inner {
                sql: Sql::new(records.schema(), &config.queue),
                pool,
                core: BrokerCore::new(Arc::new(records.clone()), scope),
                records,
                held: Held::new(),
                completer: OnceLock::new(),
                config,
            }),
        })
    }

    /// Whether pgmq is installed and has the queue: `(installed, queue)`.
    async fn installed(&self) -> Result<bool> {
        let row = q(&self.inner.sql.exists)
            .bind(&self.inner.config.queue)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "look for pgmq"))?;
        if !row.get::<bool, _>("installed") {
            return Err(Error::new(
                ErrorKind::Config,
                "pgmq is not installed in this database: `CREATE EXTENSION pgmq` (Supabase: enable Queues), or \
                 its SQL-only install (docs/pgmq.md)",
            ));
        }
        Ok(row.get("queue"))
    }

    async fn check(&self) -> Result<()> {
        if !self.installed().await? {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "pgmq has no queue {}: `SELECT pgmq.create(...)`, or PgmqBackend::setup",
                    self.inner.config.queue
                ),
            ));
        }
        self.inner.core.check_store().await
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.inner.config.queue
    }

    /// The name this queue's records have in the record store: `pgmq:<schema>.<queue>`.
    pub fn record_scope(&self) -> &str {
        self.inner.core.scope()
    }

    /// Deletes the archived messages of `key` (pgmq keeps a dead-lettered message in the queue's
    /// archive table); the number deleted. Forgetting a key is this, then
    /// [`Forget::forget_key`](redrive_core::Forget::forget_key) on the records store.
    pub async fn forget_archived(&self, key: &redrive_core::IdempotencyKey) -> Result<u64> {
        let done = q(&self.inner.sql.forget_archived)
            .bind(key.as_str())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "forget a key's archived messages"))?;
        Ok(done.rows_affected())
    }

    /// Whether `text` is in a message of the queue or its archive, or in a failure record (a
    /// test aid: a purge forgets payloads).
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let row = q(&self.inner.sql.mention)
            .bind(text)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "look for a text"))?;
        if row.get::<bool, _>("holds") {
            return Ok(true);
        }
        self.inner.core.records().records_mention(self.inner.core.scope(), text).await
    }

    /// The message a job is sent as: its envelope, and the time it becomes visible.
    fn outgoing(&self, job: &NewJob) -> Result<(Value, DateTime<Utc>)> {
        let max = self.inner.config.max_payload;
        if job.payload_len() > max {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "job {} has a payload of {} bytes, over the {max} bytes this queue takes",
                    job.key,
                    job.payload_len()
                ),
            ));
        }
        job.check_fits(&self.capabilities())?;
        let envelope = serde_json::to_value(Envelope::new(job))
            .map_err(|e| Error::new(ErrorKind::InvalidInput, "the job's envelope is not JSON").with_source(e))?;
        Ok((envelope, job.not_before.unwrap_or_else(Utc::now)))
    }

    /// Sends every job in one statement on `conn`: all or none. The jobs are checked
    /// ([`outgoing`](Self::outgoing)) first.
    async fn send(&self, conn: &mut PgConnection, jobs: &[&NewJob], what: &str) -> Result<Vec<JobId>> {
        let mut messages = Vec::with_capacity(jobs.len());
        let mut visible = Vec::with_capacity(jobs.len());
        for job in jobs {
            let (message, at) = self.outgoing(job)?;
            messages.push(message);
            visible.push(at);
        }
        let headers: Vec<Option<Value>> = vec![None; jobs.len()];
        let rows = q(&self.inner.sql.send)
            .bind(&self.inner.config.queue)
            .bind(&messages)
            .bind(&headers)
            .bind(&visible)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| send_error(e, what))?;
        Ok(rows.iter().map(|r| JobId(r.get::<i64, _>("msg_id").to_string())).collect())
    }
}

/// A refused send: a payload `jsonb` cannot hold (a NUL character) is the job's fault, not the
/// database's.
fn send_error(e: sqlx::Error, what: &str) -> Error {
    let untranslatable = matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("22P05"));
    if untranslatable {
        return Error::new(
            ErrorKind::InvalidInput,
            format!("pgmq: {what}: a payload holds text jsonb cannot store (\\u0000)"),
        )
        .with_source(e);
    }
    db(e, what)
}

impl Backend for PgmqBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The key's row is written with the message (`broker_keys`), kept until a purge of
            // its record or `prune_keys`.
            dedupe: Dedupe::Kept,
            max_payload: self.inner.config.max_payload,
            max_claim: 1000,
            atomic_batch: true,
            // A release gives the read back (our database: the count is ours to lower).
            release_refunds: true,
            // A worker killed holding messages: each comes back when its visibility lapses, read
            // again, so its attempt is charged.
            crash_refunds: false,
            claim_by_kind: true,
            // pgmq's read takes whole seconds of visibility.
            min_lease: Duration::from_secs(1),
            max_delay: Some(Duration::MAX),
            // Its failed message leaves the queue and the next runs, as on every broker.
            order_per_key: false,
            // The ledger's entry is the records database's, which the broker kit does not
            // re-fingerprint.
            amend_replay: false,
            // Not yet: pgmq's table can be listed, which a later version will use.
            live_jobs: false,
            // pgmq reads in message id order.
            priorities: false,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("pgmq")
    }

    fn messaging_destination(&self) -> Option<String> {
        Some(self.queue_name().to_owned())
    }
}

impl Enqueue for PgmqBackend {
    /// The key's row and the message in one transaction: a second enqueue of the key answers
    /// `Duplicate` (or `Failed`, or `KeyConflict` for another payload).
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        Ok(self.enqueue_batch(vec![job]).await?.remove(0))
    }

    /// One transaction: every job's key and message, or nothing (a reused key with another
    /// payload refuses the whole batch).
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin enqueue"))?;
        let answers = self.enqueue_on(&mut tx, &jobs).await?;
        tx.commit().await.map_err(|e| db(e, "commit enqueue"))?;
        Ok(answers)
    }
}

impl QueueStats for PgmqBackend {
    /// `pgmq.metrics`, exact: ready messages are queued, hidden ones running or waiting out a
    /// delay (pgmq does not tell them apart); the oldest message's age.
    async fn counts(&self) -> Result<Counts> {
        let row = q(&self.inner.sql.metrics)
            .bind(&self.inner.config.queue)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the queue's metrics"))?;
        let all = row.get::<i64, _>("queue_length").max(0) as u64;
        let visible = row.get::<i64, _>("queue_visible_length").max(0) as u64;
        let oldest = row.get::<Option<i32>, _>("oldest_msg_age_sec");
        Ok(Counts {
            queued: visible,
            running: all.saturating_sub(visible),
            scheduled: None,
            oldest_ready: (visible > 0).then(|| Duration::from_secs(oldest.unwrap_or(0).max(0) as u64)),
        })
    }
}

/// The error history a message's headers carry.
fn carried(headers: Option<&str>) -> Carried {
    headers
        .and_then(|h| serde_json::from_str::<Value>(h).ok())
        .and_then(|h| h.get(HEADER).cloned())
        .and_then(|c| serde_json::from_value(c).ok())
        .unwrap_or_default()
}

/// A message's headers with redrive's part replaced by `errors`.
fn with_errors(headers: Option<&str>, errors: &[AttemptError]) -> Value {
    let mut headers = headers
        .and_then(|h| serde_json::from_str::<Value>(h).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(Default::default()));
    headers[HEADER] = serde_json::json!({ "errors": errors });
    headers
}

/// Seconds, for pgmq's integer visibility (at least one).
fn whole_seconds(d: Duration) -> i32 {
    d.as_secs_f64().ceil().clamp(1.0, i32::MAX as f64) as i32
}

/// Seconds, exact, for the fenced updates.
fn seconds(d: Duration) -> f64 {
    d.as_secs_f64().min(i32::MAX as f64)
}
