//! `SqliteBackend`: every redrive contract on one SQLite file.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{AttemptError, Backend, Capabilities, Dedupe, Lease};
use redrive_core::{
    Counts, Enqueue, Enqueued, Error, ErrorKind, IdempotencyKey, JobId, NewJob, ProviderKey, QueueStats, Result,
};
use serde_json::Value;
use sqlx::{Row, SqliteConnection, SqlitePool};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::config::SqliteConfig;
use crate::error::{db, stored};
use crate::sql::{self, q};

mod broker_records;
mod claim;
mod completer;
mod dead_letters;
mod flow;
mod jobs;
mod ledger;

/// redrive on SQLite: the queue, the failure records and the effect ledger in one file (beside
/// the application's own tables, if it likes). Clones share the connections.
///
/// SQLite takes one writer at a time, so every write goes through one writer connection, in
/// `BEGIN IMMEDIATE` transactions: handlers in this process queue for it instead of failing as
/// busy, and other processes wait up to the busy timeout. Claims take a batch of jobs in one
/// transaction, and completions that queue meanwhile are committed together. Reads (records, counts) use reader
/// connections beside it, which WAL mode lets run during writes.
#[derive(Clone)]
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    writer: SqlitePool,
    reader: SqlitePool,
    config: SqliteConfig,
    /// Completions, grouped into shared transactions on the writer (see `completer`).
    completions: tokio::sync::mpsc::Sender<completer::Completion>,
    /// Enqueues, retries, replays, and the completion or discard of a job with an order key, in
    /// this process, wake its waiting claims at once.
    work: Notify,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend").field("path", &self.inner.config.path).finish_non_exhaustive()
    }
}

/// What [`SqliteBackend::effect_once`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOnce {
    /// The key is now taken inside the caller's transaction: make the effect there and commit.
    Fresh,
    /// The effect was applied by an earlier transaction, at this time: skip it.
    AlreadyApplied(DateTime<Utc>),
}

/// Rows a maintenance write (purge, prune) deletes per transaction: the write lock is held for one
/// batch, milliseconds, then let go (see [`let_others_write`]).
pub(crate) const CHUNK: i64 = 500;

/// Between two batches of a maintenance write, the write lock is left free for as long as the
/// last batch held it (at least 5 ms). This process's writes queue for the connection and get it
/// at once; another process's wait in SQLite's busy handler, which looks again only every few
/// (up to 100) milliseconds, and would rarely find a gap of microseconds.
pub(crate) async fn let_others_write(held: Duration) {
    tokio::time::sleep(held.max(Duration::from_millis(5))).await;
}

/// How long one write transaction waited for the writer connection, ran its statements, and
/// committed: a trace event (target `redrive_sqlite::writes`) that the throughput bench sums
/// into its per-job breakdown. Never the jobs' contents.
struct WriteTiming {
    started: std::time::Instant,
    begun: std::time::Instant,
    committing: std::time::Instant,
}

impl WriteTiming {
    fn start() -> Self {
        let now = std::time::Instant::now();
        Self { started: now, begun: now, committing: now }
    }

    /// The transaction has the writer.
    fn begun(&mut self) {
        self.begun = std::time::Instant::now();
    }

    /// Its statements ran; the commit starts.
    fn committing(&mut self) {
        self.committing = std::time::Instant::now();
    }

    /// Committed: `write` names the transaction, `jobs` how many jobs it wrote.
    fn done(self, write: &'static str, jobs: usize) {
        let micros = |d: Duration| d.as_micros() as u64;
        tracing::trace!(
            target: "redrive_sqlite::writes",
            write,
            jobs,
            wait_us = micros(self.begun - self.started),
            statements_us = micros(self.committing - self.begun),
            commit_us = micros(self.committing.elapsed()),
        );
    }
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn key_from(s: String) -> Result<IdempotencyKey> {
    IdempotencyKey::parse(s).map_err(|_| stored("key"))
}

fn provider_key_from(s: &str) -> Result<ProviderKey> {
    Uuid::parse_str(s).map(ProviderKey::from_uuid).map_err(|_| stored("provider key"))
}

fn json_from(s: &str, what: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|_| stored(what))
}

/// A stored key, or for one that does not read back a stand-in naming its job.
fn key_or_stand_in(stored: String, job: i64) -> IdempotencyKey {
    key_from(stored)
        .unwrap_or_else(|_| IdempotencyKey::parse(format!("redrive_unreadable:job={job}")).expect("a canonical key"))
}

/// A stored payload: its JSON, or the text as it is where it is not JSON.
fn payload_as_stored(stored: String) -> Value {
    serde_json::from_str(&stored).unwrap_or(Value::String(stored))
}

/// A stored error history; one that does not read back is left out rather than fail a record.
fn history(stored: &str) -> Vec<AttemptError> {
    serde_json::from_str(stored).unwrap_or_default()
}

fn parse_id(id: &str) -> Result<i64> {
    id.parse().map_err(|_| Error::new(ErrorKind::NotFound, format!("no job or record with id {id:?}")))
}

fn lease_lost(lease: &Lease) -> Error {
    Error::new(ErrorKind::LeaseLost, format!("job {} is no longer held by this lease", lease.job_id))
}

fn key_conflict(key: &IdempotencyKey, id: i64) -> Error {
    Error::new(ErrorKind::KeyConflict, format!("key {key} already belongs to job {id} with a different payload"))
}

impl SqliteBackend {
    /// The backend on its two pools (the writer's one connection, and the readers), its
    /// completer started; [`open`](Self::open) makes them.
    pub(crate) fn from_pools(writer: SqlitePool, reader: SqlitePool, config: SqliteConfig) -> Self {
        let completions = completer::start(writer.clone());
        Self { inner: Arc::new(Inner { writer, reader, config, completions, work: Notify::new() }) }
    }

    /// The writer pool (one connection): for the application's own transactions, such as
    /// [`enqueue_in`](Self::enqueue_in) and [`effect_once`](Self::effect_once).
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.writer
    }

    /// Enqueues inside the caller's transaction (on [`pool`](Self::pool)): the job exists if and
    /// only if it commits. Call [`wake`](Self::wake) after the commit.
    pub async fn enqueue_in(&self, conn: &mut SqliteConnection, job: NewJob) -> Result<Enqueued> {
        job.check_fits(&self.capabilities())?;
        enqueue_on(conn, &job, &job.fingerprint()).await
    }

    /// Wakes this process's waiting claims (after committing a transaction that enqueued).
    pub fn wake(&self) {
        self.inner.work.notify_waiters();
    }

    /// For a same-database effect, inside the caller's transaction: takes `key` in the
    /// `redrive_applied_effects` table. `Fresh`: make the effect in the same transaction and
    /// commit; the key and the effect land together or not at all.
    pub async fn effect_once(&self, conn: &mut SqliteConnection, key: &IdempotencyKey) -> Result<EffectOnce> {
        let taken = q(sql::effect_begin)
            .bind(key.as_str())
            .bind(now_ms())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db(e, "take effect key"))?;
        if taken.is_some() {
            return Ok(EffectOnce::Fresh);
        }
        let at: i64 = q(sql::effect_result)
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db(e, "read effect key"))?
            .get(0);
        Ok(EffectOnce::AlreadyApplied(time(at)))
    }

    /// Deletes jobs done more than `older_than` ago, with their keys' ledger entries, and the
    /// ledger's other done keys (other queues' jobs, HTTP requests) and same-database effect keys
    /// as old; returns how many jobs. Run it now and then, or the file keeps every job ever done.
    /// The age is the dedupe window it leaves: a key enqueued again after its job was pruned makes
    /// a new job. Alert keys stay with their records (see `purge`).
    /// It deletes in batches, each its own short transaction, so that other writers (this
    /// process's completions, other processes) get the write lock between them.
    pub async fn prune_done(&self, older_than: Duration) -> Result<u64> {
        let before = now_ms() - ms(older_than);
        let mut pruned = 0;
        loop {
            let started = std::time::Instant::now();
            let mut tx = self.write().await?;
            let step = |e| db(e, "prune");
            q(sql::prune_done_keys).bind(before).bind(CHUNK).execute(&mut *tx).await.map_err(step)?;
            let done =
                q(sql::prune_done).bind(before).bind(CHUNK).execute(&mut *tx).await.map_err(step)?.rows_affected();
            let keys =
                q(sql::prune_ledger).bind(before).bind(CHUNK).execute(&mut *tx).await.map_err(step)?.rows_affected();
            let effects =
                q(sql::prune_effects).bind(before).bind(CHUNK).execute(&mut *tx).await.map_err(step)?.rows_affected();
            tx.commit().await.map_err(|e| db(e, "commit prune"))?;
            pruned += done;
            if done < CHUNK as u64 && keys < CHUNK as u64 && effects < CHUNK as u64 {
                return Ok(pruned);
            }
            let_others_write(started.elapsed()).await;
        }
    }

    /// Whether `text` appears in any of redrive's tables (a test aid: a purge forgets payloads).
    #[cfg(feature = "test-hooks")]
    pub async fn holds_text(&self, text: &str) -> Result<bool> {
        let probe = "SELECT EXISTS (
            SELECT 1 FROM redrive_jobs WHERE instr(payload, ?1) OR instr(errors, ?1)
            UNION ALL SELECT 1 FROM redrive_failed_jobs WHERE instr(payload, ?1) OR instr(errors, ?1) OR instr(last_error, ?1)
            UNION ALL SELECT 1 FROM redrive_processed_keys WHERE instr(coalesce(result, ''), ?1))";
        let row = q(probe).bind(text).fetch_one(&self.inner.reader).await.map_err(|e| db(e, "search"))?;
        Ok(row.get::<bool, _>(0))
    }

    /// A write transaction: the writer connection, `BEGIN IMMEDIATE` (the write lock up front, so
    /// another process's writer makes it wait, not fail midway).
    async fn write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.inner.writer.begin_with("BEGIN IMMEDIATE").await.map_err(|e| db(e, "begin a write"))
    }

    /// Runs a fenced single-statement update on `lease`'s job.
    async fn fenced(
        &self,
        query: sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        lease: &Lease,
        what: &str,
    ) -> Result<()> {
        let row = query.fetch_optional(&self.inner.writer).await.map_err(|e| db(e, what))?;
        row.map(|_| ()).ok_or_else(|| lease_lost(lease))
    }
}

/// The enqueue of one job on `conn` (the writer, or the caller's transaction).
async fn enqueue_on(conn: &mut SqliteConnection, job: &NewJob, fingerprint: &str) -> Result<Enqueued> {
    let created = q(sql::enqueue)
        .bind(&job.kind)
        .bind(job.key.as_str())
        .bind(job.provider_key.as_uuid().to_string())
        .bind(job.payload.to_string())
        .bind(fingerprint)
        .bind(job.severity.as_str())
        .bind(i64::from(job.cap))
        .bind(now_ms())
        .bind(job.deadline.map(|at| at.timestamp_millis()))
        .bind(job.not_before.map(|at| at.timestamp_millis()))
        .bind(job.order_key.as_deref())
        .bind(job.priority)
        .bind(job.traceparent.as_deref())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| db(e, "enqueue"))?;
    if let Some(row) = created {
        return Ok(Enqueued::Created(JobId(row.get::<i64, _>("id").to_string())));
    }
    let row = q(sql::existing).bind(job.key.as_str()).fetch_one(&mut *conn).await.map_err(|e| db(e, "enqueue"))?;
    let id: i64 = row.get("id");
    if row.get::<String, _>("fingerprint") != fingerprint {
        return Err(key_conflict(&job.key, id));
    }
    if row.get::<String, _>("status") == "failed" {
        return Ok(Enqueued::Failed { id: JobId(id.to_string()) });
    }
    let provider_key = provider_key_from(&row.get::<String, _>("provider_key"))?;
    Ok(Enqueued::Duplicate { id: JobId(id.to_string()), provider_key: Some(provider_key) })
}

impl Backend for SqliteBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dedupe: Dedupe::Kept,
            max_payload: self.inner.config.max_payload,
            max_claim: 1000,
            atomic_batch: true,
            release_refunds: true,
            crash_refunds: true,
            claim_by_kind: true,
            min_lease: Duration::from_millis(1),
            // `ready_at`: a scheduled job is not claimable before it.
            max_delay: Some(Duration::MAX),
            order_per_key: true,
            amend_replay: true,
            live_jobs: true,
            priorities: true,
        }
    }

    fn messaging_system(&self) -> Option<&'static str> {
        Some("sqlite")
    }
}

impl Enqueue for SqliteBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        job.check_fits(&self.capabilities())?;
        let mut tx = self.write().await?;
        let result = enqueue_on(&mut tx, &job, &job.fingerprint()).await?;
        tx.commit().await.map_err(|e| db(e, "commit enqueue"))?;
        if result.is_created() {
            self.wake();
        }
        Ok(result)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let mut fingerprints = std::collections::HashMap::new();
        for job in &jobs {
            job.check_fits(&self.capabilities())?;
            let fingerprint = job.fingerprint();
            if fingerprints.insert(&job.key, fingerprint.clone()).is_some_and(|f| f != fingerprint) {
                return Err(Error::new(
                    ErrorKind::KeyConflict,
                    format!("key {} is used with two payloads in one batch", job.key),
                ));
            }
        }
        // All or nothing: a conflict rolls the transaction back on drop.
        let mut tx = self.write().await?;
        let mut results = Vec::with_capacity(jobs.len());
        for job in &jobs {
            results.push(enqueue_on(&mut tx, job, &fingerprints[&job.key]).await?);
        }
        tx.commit().await.map_err(|e| db(e, "commit batch enqueue"))?;
        if results.iter().any(Enqueued::is_created) {
            self.wake();
        }
        Ok(results)
    }
}

impl QueueStats for SqliteBackend {
    async fn counts(&self) -> Result<Counts> {
        let now = now_ms();
        let row =
            q(sql::queue_counts).bind(now).fetch_one(&self.inner.reader).await.map_err(|e| db(e, "count jobs"))?;
        let count = |column: &str| row.get::<i64, _>(column).max(0) as u64;
        let oldest_ready =
            row.get::<Option<i64>, _>("oldest_ready").map(|at| Duration::from_millis((now - at).max(0) as u64));
        Ok(Counts {
            queued: count("queued"),
            running: count("running"),
            scheduled: Some(count("scheduled")),
            oldest_ready,
        })
    }
}
