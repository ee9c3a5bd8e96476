//! `PgBackend`: every redrive contract on PostgreSQL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{Backend, Capabilities, Dedupe};
use redrive_core::{
    Counts, Enqueue, Enqueued, Error, ErrorKind, IdempotencyKey, JobId, NewJob, ProviderKey, QueueStats, Result,
};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};
use tokio::sync::{Notify, OnceCell};
use tracing::debug;
use uuid::Uuid;

mod broker_records;
mod claim;
mod dead_letters;
mod doctor;
mod flow;
mod jobs;
mod ledger;
mod scan_floor;

use self::scan_floor::ScanFloor;
use crate::batch::Completer;
use crate::config::PgConfig;
use crate::error::db;
use crate::ledger_batch::LedgerBatch;
use crate::sql::{Queries, check_schema, q};

/// redrive on PostgreSQL: the queue (`jobs`), the failure records (`failed_jobs`) and the effect
/// ledger, in one schema. Clones share one pool.
#[derive(Clone)]
pub struct PgBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    sql: Arc<Queries>,
    schema: String,
    channel: String,
    config: PgConfig,
    completer: Completer,
    /// Groups the effect ledger's begins and finishes (a broker's workers').
    ledger: LedgerBatch,
    /// Claims and completions running at once (see `PgConfig::with_in_flight`).
    in_flight: Arc<tokio::sync::Semaphore>,
    wake: OnceCell<Arc<Notify>>,
    notify_pending: Arc<AtomicBool>,
    last_sweep: tokio::sync::Mutex<tokio::time::Instant>,
    floor: Mutex<ScanFloor>,
    /// The claim statement for each batch size asked for (see `claim.sql`).
    claim_by_limit: Mutex<HashMap<usize, Arc<str>>>,
}

/// What [`PgBackend::effect_once`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOnce {
    /// The key is now taken inside the caller's transaction: make the effect there and commit.
    Fresh,
    /// The effect was applied by an earlier transaction, at this time: skip it.
    AlreadyApplied(DateTime<Utc>),
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend").field("schema", &self.inner.schema).finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Uses an existing pool (the application's own); `config`'s URL and pool size are ignored.
    pub fn from_pool(pool: PgPool, config: PgConfig) -> Result<Self> {
        check_schema(&config.schema)?;
        let sql = Arc::new(Queries::new(&config.schema));
        let in_flight = Arc::new(tokio::sync::Semaphore::new(config.in_flight));
        let completer = Completer::start(pool.clone(), Arc::clone(&sql), Arc::clone(&in_flight));
        let ledger = LedgerBatch::start(pool.clone(), Arc::clone(&sql));
        Ok(Self {
            inner: Arc::new(Inner {
                channel: format!("redrive_{}", config.schema),
                schema: config.schema.clone(),
                pool,
                sql,
                config,
                completer,
                ledger,
                in_flight,
                wake: OnceCell::new(),
                notify_pending: Arc::new(AtomicBool::new(false)),
                last_sweep: tokio::sync::Mutex::new(tokio::time::Instant::now()),
                floor: Mutex::default(),
                claim_by_limit: Mutex::default(),
            }),
        })
    }

    /// The pool, for the application's own queries and transactions.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema name.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Enqueues inside the caller's transaction: the job exists if and only if it commits.
    /// Call [`wake`](Self::wake) after the commit to start it without waiting for a poll.
    ///
    /// A job with an order key takes its key's turn first (enqueues of one key wait for each
    /// other's transactions to end: see `order_lock.sql`), in a transaction of its own, or a
    /// savepoint of yours (begun with sqlx's `begin`).
    pub async fn enqueue_in(&self, conn: &mut PgConnection, job: NewJob) -> Result<Enqueued> {
        check_payload(&job, &self.capabilities())?;
        let Some(order) = &job.order_key else {
            return self.insert(conn, &job).await;
        };
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(|e| db(e, "begin enqueue"))?;
        q(&self.inner.sql.order_lock)
            .bind(std::slice::from_ref(order))
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "take the order key's turn"))?;
        let result = self.insert(&mut tx, &job).await?;
        tx.commit().await.map_err(|e| db(e, "commit enqueue"))?;
        Ok(result)
    }

    /// The enqueue statement, retried once for a conflicting insert it could not see.
    async fn insert(&self, conn: &mut PgConnection, job: &NewJob) -> Result<Enqueued> {
        let fingerprint = job.fingerprint();
        let mut row = None;
        // No row at all: the conflicting insert committed after this statement's snapshot was
        // taken. The next statement's snapshot sees it (under READ COMMITTED).
        for _ in 0..2 {
            row = q(&self.inner.sql.enqueue)
                .bind(&job.kind)
                .bind(job.key.as_str())
                .bind(job.provider_key.as_uuid())
                .bind(&job.payload)
                .bind(&fingerprint)
                .bind(job.severity.as_str())
                .bind(job.cap as i32)
                .bind(job.deadline)
                .bind(job.not_before)
                .bind(job.order_key.as_deref())
                .bind(job.priority)
                .bind(job.traceparent.as_deref())
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db(e, "enqueue"))?;
            if row.is_some() {
                break;
            }
        }
        let Some(row) = row else {
            return Err(Error::temporary(format!("job {} is being enqueued concurrently", job.key)));
        };
        let id = JobId(row.get::<i64, _>("id").to_string());
        if row.get::<bool, _>("created") {
            return Ok(Enqueued::Created(id));
        }
        if row.get::<String, _>("fingerprint") != fingerprint {
            return Err(key_conflict(&job.key, &id));
        }
        if row.get::<Option<&str>, _>("status") == Some("failed") {
            return Ok(Enqueued::Failed { id });
        }
        let provider_key = row.get::<Option<Uuid>, _>("provider_key").map(ProviderKey::from_uuid);
        Ok(Enqueued::Duplicate { id, provider_key })
    }

    /// Wakes idle workers now (after committing a transaction that enqueued).
    pub fn wake(&self) {
        let inner = &self.inner;
        // One notification in flight is enough: it is sent after every commit that set the flag.
        if inner.notify_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let (pool, sql, channel, pending) =
            (inner.pool.clone(), Arc::clone(&inner.sql), inner.channel.clone(), Arc::clone(&inner.notify_pending));
        tokio::spawn(async move {
            pending.store(false, Ordering::Release);
            if let Err(e) = q(&sql.notify).bind(channel).execute(&pool).await {
                debug!(error = %e, "notify failed; workers will find the job by polling");
            }
        });
    }

    /// For a same-database effect, inside the caller's transaction: takes `key` in the
    /// `applied_effects` table. `Fresh`: make the effect in the same transaction and commit;
    /// the key and the effect land together or not at all. A concurrent transaction with the same
    /// key waits here until this one ends.
    pub async fn effect_once(&self, conn: &mut PgConnection, key: &IdempotencyKey) -> Result<EffectOnce> {
        let taken = q(&self.inner.sql.effect_begin)
            .bind(key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db(e, "take effect key"))?;
        if taken.is_some() {
            return Ok(EffectOnce::Fresh);
        }
        let at: DateTime<Utc> = q(&self.inner.sql.effect_result)
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db(e, "read effect key"))?
            .get(0);
        Ok(EffectOnce::AlreadyApplied(at))
    }

    /// Opens a transaction with `key` taken for a same-database effect, or `None` if the effect
    /// was already applied. Make the effect on the transaction, then commit it.
    pub async fn effect_tx(&self, key: &IdempotencyKey) -> Result<Option<Transaction<'static, Postgres>>> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin"))?;
        match self.effect_once(&mut tx, key).await? {
            EffectOnce::Fresh => Ok(Some(tx)),
            EffectOnce::AlreadyApplied(_) => Ok(None),
        }
    }

    /// Deletes jobs that finished (done) more than `older_than` ago, with their keys, and the
    /// effect ledger's done keys of other queues' jobs and the applied effects as old; returns
    /// how many jobs. Run it now and then (a daily task), or the tables keep every job ever done.
    /// The age is the dedupe window it leaves: a key enqueued again after its job was pruned makes
    /// a new job, so keep it longer than any producer may repeat a job. Failure records (and their
    /// alert keys) are pruned apart, by [`DeadLetter::purge`](redrive_core::DeadLetter::purge).
    pub async fn prune_done(&self, older_than: Duration) -> Result<u64> {
        // Bounded transactions: a large first prune does not hold its locks for long.
        const CHUNK: i64 = 10_000;
        let mut pruned = 0;
        loop {
            let done = q(&self.inner.sql.prune_done)
                .bind(older_than.as_secs_f64())
                .bind(CHUNK)
                .execute(&self.inner.pool)
                .await
                .map_err(|e| db(e, "prune done jobs"))?
                .rows_affected();
            pruned += done;
            if done < CHUNK as u64 {
                break;
            }
        }
        // The ledger rows of other queues' keys, and same-database effects, as old (alert keys
        // stay: they go with their records' purge).
        loop {
            let done: i64 = q(&self.inner.sql.prune_ledger)
                .bind(older_than.as_secs_f64())
                .bind(CHUNK)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| db(e, "prune the effect ledger"))?
                .get("pruned");
            if done < CHUNK {
                return Ok(pruned);
            }
        }
    }
}
/// Refuses, before anything is written, what does not fit `capabilities` (a payload over the limit,
/// a priority out of range) or a payload that `jsonb` cannot hold: a NUL character (`\u0000`)
/// anywhere in a string or a member's name. Refused with [`ErrorKind::InvalidPayload`] rather than
/// changed, so that the handler gets what was sent.
fn check_payload(job: &NewJob, capabilities: &Capabilities) -> Result<()> {
    fn holds_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(holds_nul),
            Value::Object(members) => members.iter().any(|(name, v)| name.contains('\0') || holds_nul(v)),
            _ => false,
        }
    }
    job.check_fits(capabilities)?;
    if holds_nul(&job.payload) {
        return Err(Error::new(
            ErrorKind::InvalidPayload,
            format!("the payload of job {} holds a NUL character, which PostgreSQL's jsonb cannot store", job.key),
        ));
    }
    Ok(())
}

fn key_conflict(key: &IdempotencyKey, id: &JobId) -> Error {
    Error::new(ErrorKind::KeyConflict, format!("key {key} already belongs to job {id} with a different payload"))
}

fn key_from(s: String) -> Result<IdempotencyKey> {
    IdempotencyKey::parse(s).map_err(|e| Error::new(ErrorKind::Decode, format!("stored key: {e}")))
}

impl Enqueue for PgBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        let mut conn = self.inner.pool.acquire().await.map_err(|e| db(e, "enqueue"))?;
        let result = self.enqueue_in(&mut conn, job).await?;
        if result.is_created() {
            self.wake();
        }
        Ok(result)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut fingerprints: HashMap<&IdempotencyKey, String> = HashMap::new();
        let caps = self.capabilities();
        for job in &jobs {
            check_payload(job, &caps)?;
            let fingerprint = job.fingerprint();
            if fingerprints.insert(&job.key, fingerprint.clone()).is_some_and(|f| f != fingerprint) {
                return Err(Error::new(
                    ErrorKind::KeyConflict,
                    format!("key {} is used with two payloads in one batch", job.key),
                ));
            }
        }
        let column = |f: fn(&NewJob) -> String| jobs.iter().map(f).collect::<Vec<_>>();
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin"))?;
        let orders: Vec<&str> = jobs.iter().filter_map(|j| j.order_key.as_deref()).collect();
        if !orders.is_empty() {
            q(&self.inner.sql.order_lock)
                .bind(&orders)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "take the order keys' turn"))?;
        }
        let inserted = q(&self.inner.sql.enqueue_batch)
            .bind(column(|j| j.kind.clone()))
            .bind(column(|j| j.key.to_string()))
            .bind(jobs.iter().map(|j| j.provider_key.as_uuid()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.payload.clone()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| fingerprints[&j.key].clone()).collect::<Vec<_>>())
            .bind(column(|j| j.severity.as_str().to_owned()))
            .bind(jobs.iter().map(|j| j.cap as i32).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.deadline).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.not_before).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.order_key.clone()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.traceparent.clone()).collect::<Vec<_>>())
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db(e, "batch enqueue"))?;
        let created: HashMap<String, i64> = inserted.iter().map(|r| (r.get("idempotency_key"), r.get("id"))).collect();
        let others: Vec<String> = jobs.iter().map(|j| j.key.to_string()).filter(|k| !created.contains_key(k)).collect();
        let mut existing: HashMap<String, (i64, String, Option<Uuid>, Option<String>)> = HashMap::new();
        if !others.is_empty() {
            let rows = q(&self.inner.sql.existing)
                .bind(&others)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db(e, "batch enqueue"))?;
            for r in rows {
                let found = (r.get("id"), r.get("fingerprint"), r.get("provider_key"), r.get("status"));
                existing.insert(r.get("idempotency_key"), found);
            }
        }
        // The same key twice in one batch: the first copy created it, with its provider key.
        let mut first_seen: HashMap<&str, ProviderKey> = HashMap::new();
        let mut results = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let key = job.key.as_str();
            if let Some(id) = created.get(key) {
                let id = JobId(id.to_string());
                results.push(match first_seen.get(key) {
                    None => {
                        first_seen.insert(key, job.provider_key);
                        Enqueued::Created(id)
                    }
                    Some(first) => Enqueued::Duplicate { id, provider_key: Some(*first) },
                });
            } else if let Some((id, fingerprint, provider_key, status)) = existing.get(key) {
                let id = JobId(id.to_string());
                if *fingerprint != fingerprints[&job.key] {
                    // All or nothing: the transaction rolls back on drop.
                    return Err(key_conflict(&job.key, &id));
                }
                results.push(if status.as_deref() == Some("failed") {
                    Enqueued::Failed { id }
                } else {
                    Enqueued::Duplicate { id, provider_key: provider_key.map(ProviderKey::from_uuid) }
                });
            } else {
                return Err(Error::temporary(format!("job {key} is being enqueued concurrently")));
            }
        }
        tx.commit().await.map_err(|e| db(e, "commit batch enqueue"))?;
        if !created.is_empty() {
            self.wake();
        }
        Ok(results)
    }
}

impl Backend for PgBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dedupe: Dedupe::Kept,
            max_payload: self.inner.config.max_payload,
            max_claim: usize::MAX,
            atomic_batch: true,
            release_refunds: true,
            crash_refunds: true,
            claim_by_kind: true,
            min_lease: Duration::from_millis(1),
            // `run_at`: a scheduled job is not claimable before it.
            max_delay: Some(Duration::MAX),
            order_per_key: true,
            amend_replay: true,
            live_jobs: true,
            priorities: true,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("postgresql")
    }

    /// The schema: its jobs table is the queue.
    fn messaging_destination(&self) -> Option<String> {
        Some(self.schema().to_owned())
    }
}

impl QueueStats for PgBackend {
    async fn counts(&self) -> Result<Counts> {
        let row = q(&self.inner.sql.queue_counts).fetch_one(&self.inner.pool).await.map_err(|e| db(e, "count jobs"))?;
        let count = |column: &str| row.get::<i64, _>(column).max(0) as u64;
        let oldest_ready =
            row.get::<Option<f64>, _>("oldest_ready_seconds").map(|s| Duration::from_secs_f64(s.max(0.0)));
        Ok(Counts {
            queued: count("queued"),
            running: count("running"),
            scheduled: Some(count("scheduled")),
            oldest_ready,
        })
    }
}
