//! `SqliteBackend`: every redrive contract on one SQLite file.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::{
    AttemptError, Backend, Begin, Capabilities, Claim, Claimed, Counts, DeadLetter, Dedupe, Enqueue, Enqueued, Error,
    ErrorKind, FailureId, FailureQuery, FailureRecord, Hold, IdempotencyKey, JobId, JobRecord, Kinds, Lease, Ledger,
    NewJob, ProviderKey, QueueStats, RecordState, Renew, Replay, ReplayOutcome, Result, Severity, require_audit,
};
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqliteConnection, SqlitePool};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::config::SqliteConfig;
use crate::error::{db, stored};
use crate::sql::{self, q};

mod broker_records;
mod completer;

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
    /// Enqueues, retries and replays of this process wake its waiting claims at once.
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
    /// Opens (or creates) the database and brings its tables up to date. A file that is not a
    /// SQLite database, or that another process holds locked past the busy timeout, is a clear
    /// error here rather than at the first job.
    pub async fn open(config: SqliteConfig) -> Result<Self> {
        let base = match &config.path {
            Some(path) => {
                SqliteConnectOptions::new().filename(path).create_if_missing(true).journal_mode(SqliteJournalMode::Wal)
            }
            None => SqliteConnectOptions::new().in_memory(true),
        };
        let base = base.busy_timeout(config.busy_timeout).synchronous(config.synchronous).foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            // Writes queue for the one connection; a long queue is not an error.
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(base.clone())
            .await
            .map_err(|e| db(e, "open the database"))?;
        let reader = match config.path {
            Some(_) => SqlitePoolOptions::new()
                .max_connections(config.readers.max(1))
                .connect_with(base.read_only(true))
                .await
                .map_err(|e| db(e, "open the database for reading"))?,
            None => writer.clone(),
        };
        let completions = completer::start(writer.clone());
        let backend = Self { inner: Arc::new(Inner { writer, reader, config, completions, work: Notify::new() }) };
        backend.migrate().await?;
        Ok(backend)
    }

    async fn migrate(&self) -> Result<()> {
        sql::migrator().run(&self.inner.writer).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => db(e, "migrate"),
            e => Error::new(ErrorKind::Backend, "sqlite: migration failed").with_source(e),
        })
    }

    /// The writer pool (one connection): for the application's own transactions, such as
    /// [`enqueue_in`](Self::enqueue_in) and [`effect_once`](Self::effect_once).
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.writer
    }

    /// Enqueues inside the caller's transaction (on [`pool`](Self::pool)): the job exists if and
    /// only if it commits. Call [`wake`](Self::wake) after the commit.
    pub async fn enqueue_in(&self, conn: &mut SqliteConnection, job: NewJob) -> Result<Enqueued> {
        job.check_size(self.inner.config.max_payload)?;
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

    async fn claim_once(&self, kinds: &Kinds, max: usize, lease: Duration) -> Result<Vec<Claimed>> {
        let kinds = match kinds {
            Kinds::Any => None,
            Kinds::Only(list) => Some(serde_json::to_string(list).unwrap_or_default()),
        };
        let token = Uuid::new_v4().to_string();
        let now = now_ms();
        let mut tx = self.write().await?;
        q(sql::sweep).bind(now).execute(&mut *tx).await.map_err(|e| db(e, "sweep lapsed leases"))?;
        let rows = q(sql::claim)
            .bind(now)
            .bind(ms(lease))
            .bind(&token)
            .bind(kinds)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db(e, "claim"))?;
        tx.commit().await.map_err(|e| db(e, "commit claim"))?;
        let mut claimed: Vec<Claimed> = rows.iter().map(|row| claimed_from(row, &token)).collect();
        claimed.sort_by_key(|c| c.job.id.0.parse::<i64>().unwrap_or_default());
        Ok(claimed)
    }

    async fn give_back(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let query = q(sql::give_back).bind(id).bind(&lease.token).bind(now_ms() + ms(delay));
        self.fenced(query, lease, "give back").await?;
        self.wake();
        Ok(())
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

/// A claimed row. The row is its key's ledger entry, and the claim took the key: the hold is the
/// lease, resumed when an earlier claim may have started the effect. A row that does not read
/// back (written by hand, or by something else) is claimed all the same, marked undecodable with
/// stand-ins for what did not read: the worker makes it a failure record, and the rest of the
/// batch runs. Failing the whole claim instead would strand the batch's other jobs behind it, at
/// every claim, for ever.
fn claimed_from(row: &SqliteRow, token: &str) -> Claimed {
    // The rowid: always an integer.
    let id = JobId(row.get::<i64, _>("id").to_string());
    let lease = Lease { job_id: id.clone(), token: token.to_owned() };
    match read_claimed(row, &id, &lease) {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!(job = %id, error = %e, "a claimed job does not read back: it becomes a failure record");
            Claimed { job: unreadable_job(row, id, e.message().to_owned()), lease, begun: None }
        }
    }
}

fn read_claimed(row: &SqliteRow, id: &JobId, lease: &Lease) -> Result<Claimed> {
    let token = &lease.token;
    let key = key_from(column(row, "idempotency_key", "key")?)?;
    let provider_key = provider_key_from(&column::<String>(row, "provider_key", "provider key")?)?;
    let hold = Hold { key: key.clone(), token: token.clone(), provider_key, lease: Some(lease.clone()) };
    let claims: i64 = column(row, "claims", "claim count")?;
    let begun = if claims > 1 { Begin::Resumed(hold) } else { Begin::Fresh(hold) };
    Ok(Claimed {
        job: JobRecord {
            id: id.clone(),
            kind: column(row, "kind", "kind")?,
            key,
            provider_key,
            payload: json_from(&column::<String>(row, "payload", "payload")?, "payload")?,
            attempt: column::<i64>(row, "attempts", "attempt count")?.max(0) as u32,
            cap: column::<i64>(row, "cap", "cap")?.max(0) as u32,
            severity: Severity::from_name(&column::<String>(row, "severity", "severity")?).unwrap_or_default(),
            enqueued_at: time(column(row, "created_at", "enqueue time")?),
            deadline: column::<Option<i64>>(row, "deadline", "deadline")?.map(time),
            // Held back until then by `ready_at`.
            not_before: None,
            stranded: column::<i64>(row, "stranded", "stranded count")?.max(0) as u32,
            undecodable: None,
        },
        lease: lease.clone(),
        begun: Some(begun),
    })
}

/// A column's value, or a `Decode` error naming it (never its value).
fn column<'r, T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>>(
    row: &'r SqliteRow,
    name: &str,
    what: &str,
) -> Result<T> {
    row.try_get(name).map_err(|_| stored(what))
}

/// A job that does not read back, with stand-ins for what did not: only its record is made of it.
fn unreadable_job(row: &SqliteRow, id: JobId, why: String) -> JobRecord {
    let key = key_or_stand_in(column(row, "idempotency_key", "key").unwrap_or_default(), id.0.parse().unwrap_or(0));
    JobRecord {
        id,
        kind: column(row, "kind", "kind").unwrap_or_default(),
        key,
        provider_key: column::<String>(row, "provider_key", "provider key")
            .and_then(|s| provider_key_from(&s))
            .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
        payload: Value::Null,
        attempt: column::<i64>(row, "attempts", "attempt count").map_or(1, |n| n.max(1) as u32),
        cap: column::<i64>(row, "cap", "cap").map_or(1, |n| n.max(1) as u32),
        severity: Severity::default(),
        enqueued_at: Utc::now(),
        deadline: None,
        not_before: None,
        stranded: 0,
        undecodable: Some(why),
    }
}

/// A record as stored. Its job may not have read back (see [`claimed_from`]): what does not read
/// is shown as it is (a payload that is not JSON as a string, for a person to read and fix), so
/// that one bad record never fails a listing.
fn record_from(row: &SqliteRow) -> Result<FailureRecord> {
    let errors: Vec<AttemptError> = history(&row.get::<String, _>("errors"));
    let state = match row.get::<String, _>("state").as_str() {
        "open" => RecordState::Open,
        "replayed" => RecordState::Replayed {
            at: time(row.get::<Option<i64>, _>("closed_at").unwrap_or_default()),
            reason: row.get::<Option<String>, _>("replay_reason").unwrap_or_default(),
            actor: row.get::<Option<String>, _>("replay_actor").unwrap_or_default(),
        },
        _ => RecordState::Discarded {
            at: time(row.get::<Option<i64>, _>("closed_at").unwrap_or_default()),
            reason: row.get::<Option<String>, _>("discard_reason").unwrap_or_default(),
            actor: row.get::<Option<String>, _>("discard_actor").unwrap_or_default(),
        },
    };
    Ok(FailureRecord {
        id: FailureId(row.get::<i64, _>("id").to_string()),
        job_id: JobId(row.get::<i64, _>("job_id").to_string()),
        kind: row.get("kind"),
        key: key_or_stand_in(row.get("idempotency_key"), row.get("job_id")),
        provider_key: provider_key_from(&row.get::<String, _>("provider_key"))
            .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
        payload: payload_as_stored(row.get("payload")),
        last_error: row.get("last_error"),
        errors,
        attempts: row.get::<i64, _>("attempts").max(0) as u32,
        cap: row.get::<i64, _>("cap").max(0) as u32,
        severity: Severity::from_name(&row.get::<String, _>("severity")).unwrap_or_default(),
        first_failed_at: time(row.get("first_failed_at")),
        last_failed_at: time(row.get("last_failed_at")),
        state,
    })
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
        }
    }
}

impl Enqueue for SqliteBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        job.check_size(self.inner.config.max_payload)?;
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
            job.check_size(self.inner.config.max_payload)?;
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

impl Claim for SqliteBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so an enqueue in between is not missed.
            let notified = self.inner.work.notified();
            let claimed = self.claim_once(kinds, max, lease).await?;
            let now = tokio::time::Instant::now();
            if !claimed.is_empty() || now >= deadline {
                return Ok(claimed);
            }
            let until = deadline.min(now + self.inner.config.poll);
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let (done, answer) = tokio::sync::oneshot::channel();
        let completion = completer::Completion { id, token: lease.token.clone(), done };
        let gone = || Error::temporary("sqlite: the backend is closing");
        self.inner.completions.send(completion).await.map_err(|_| gone())?;
        match answer.await.map_err(|_| gone())?? {
            true => Ok(()),
            false => Err(lease_lost(lease)),
        }
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let query = q(sql::retry)
            .bind(id)
            .bind(&lease.token)
            .bind(now_ms() + ms(delay))
            .bind(time(now_ms()).to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .bind(error.to_owned());
        self.fenced(query, lease, "retry").await?;
        self.wake();
        Ok(())
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.give_back(lease, delay).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.give_back(lease, Duration::ZERO).await
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let lease = &claimed.lease;
        let id = parse_id(&lease.job_id.0)?;
        // To the millisecond, as stored: the record read back equals the one returned.
        let now = time(now_ms());
        let mut tx = self.write().await?;
        let row = q(sql::fail)
            .bind(id)
            .bind(&lease.token)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "dead-letter"))?
            .ok_or_else(|| lease_lost(lease))?;
        // Read leniently: the job may be one that did not read back (see `claimed_from`), and
        // its record must be written all the same.
        let attempts = column::<i64>(&row, "attempts", "attempt count").unwrap_or(1).max(0) as u32;
        let mut errors = history(&column::<String>(&row, "errors", "error history").unwrap_or_default());
        errors.push(AttemptError { attempt: attempts, at: now, error: error.to_owned() });
        let first_failed_at = errors.first().map_or(now, |e| e.at);
        let history = serde_json::to_string(&errors).map_err(|_| stored("error history"))?;
        let text = |name: &str| column::<String>(&row, name, name).unwrap_or_default();
        let cap = column::<i64>(&row, "cap", "cap").unwrap_or(i64::from(attempts));
        let inserted = q(sql::record)
            .bind(id)
            .bind(text("kind"))
            .bind(text("idempotency_key"))
            .bind(text("provider_key"))
            .bind(text("payload"))
            .bind(error.to_owned())
            .bind(history)
            .bind(i64::from(attempts))
            .bind(cap)
            .bind(text("severity"))
            .bind(first_failed_at.timestamp_millis())
            .bind(now.timestamp_millis())
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(e, "write the failure record"))?;
        tx.commit().await.map_err(|e| db(e, "commit dead-letter"))?;
        let record_id: i64 = inserted.get("id");
        Ok(Some(FailureRecord {
            id: FailureId(record_id.to_string()),
            job_id: lease.job_id.clone(),
            kind: text("kind"),
            key: key_or_stand_in(text("idempotency_key"), id),
            provider_key: provider_key_from(&text("provider_key"))
                .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
            payload: payload_as_stored(text("payload")),
            last_error: error.to_owned(),
            errors,
            attempts,
            cap: cap.max(0) as u32,
            severity: Severity::from_name(&text("severity")).unwrap_or_default(),
            first_failed_at,
            last_failed_at: now,
            state: RecordState::Open,
        }))
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for SqliteBackend {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        let id = parse_id(&lease.job_id.0)?;
        self.fenced(q(sql::extend).bind(id).bind(&lease.token).bind(now_ms() + ms(by)), lease, "extend lease").await?;
        Ok(lease.clone())
    }
}

impl DeadLetter for SqliteBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let after = query.after.as_ref().map(|id| parse_id(&id.0)).transpose()?.unwrap_or(0);
        let job_id = query.job_id.as_ref().map(|id| parse_id(&id.0)).transpose()?;
        let rows = q(sql::list_failures)
            .bind(after)
            .bind(query.kind.clone())
            .bind(query.key.as_ref().map(|k| k.as_str().to_owned()))
            .bind(job_id)
            .bind(query.open)
            .bind(query.failed_before.map(|t| t.timestamp_millis()))
            .bind(i64::try_from(query.page_size()).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.reader)
            .await
            .map_err(|e| db(e, "list failure records"))?;
        rows.iter().map(record_from).collect()
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let n = parse_id(&id.0)?;
        let row = q(sql::get_failure)
            .bind(n)
            .fetch_optional(&self.inner.reader)
            .await
            .map_err(|e| db(e, "read a failure record"))?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        record_from(&row)
    }

    async fn count_open(&self) -> Result<u64> {
        let row = q(sql::count_open).fetch_one(&self.inner.reader).await.map_err(|e| db(e, "count records"))?;
        Ok(row.get::<i64, _>(0).max(0) as u64)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let n = parse_id(&id.0)?;
        let done = q(sql::discard)
            .bind(n)
            .bind(now_ms())
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "discard"))?;
        if done.rows_affected() == 0 {
            self.get(id).await?; // NotFound if there is no such record; closed already is fine
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        // In batches, each its own transaction: one transaction over every record would hold the
        // write lock for as long as it takes, and every other writer (this process's completions
        // queue behind it; another process's fail as busy) would wait that long.
        let before = now_ms() - ms(age);
        let mut purged = 0;
        loop {
            let started = std::time::Instant::now();
            let mut tx = self.write().await?;
            let rows =
                q(sql::purge).bind(before).bind(CHUNK).fetch_all(&mut *tx).await.map_err(|e| db(e, "purge records"))?;
            for row in &rows {
                let (record, job): (i64, i64) = (row.get("id"), row.get("job_id"));
                let step = |e| db(e, "purge a record's job and keys");
                q(sql::purge_alerts).bind(record.to_string()).execute(&mut *tx).await.map_err(step)?;
                q(sql::purge_job_key).bind(job).execute(&mut *tx).await.map_err(step)?;
                q(sql::purge_job).bind(job).execute(&mut *tx).await.map_err(step)?;
            }
            tx.commit().await.map_err(|e| db(e, "commit purge"))?;
            purged += rows.len() as u64;
            if (rows.len() as i64) < CHUNK {
                return Ok(purged);
            }
            let_others_write(started.elapsed()).await;
        }
    }
}

impl Replay for SqliteBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        let n = parse_id(&id.0)?;
        let mut tx = self.write().await?;
        let row = q(sql::get_failure)
            .bind(n)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "read a failure record"))?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        let record = record_from(&row)?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state));
        }
        let now = now_ms();
        // The existing job, reset: a fresh enqueue with the same key would only find a duplicate.
        let job = parse_id(&record.job_id.0)?;
        q(sql::requeue)
            .bind(job)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "replay"))?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "the record's job is gone"))?;
        q(sql::close_replayed)
            .bind(n)
            .bind(now)
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "replay"))?;
        tx.commit().await.map_err(|e| db(e, "commit replay"))?;
        self.wake();
        Ok(ReplayOutcome::Replayed(record.job_id))
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

impl Ledger for SqliteBackend {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let fingerprint = redrive_core::payload_fingerprint(payload);
        let (now, token) = (now_ms(), Uuid::new_v4().to_string());
        let until = now + ms(hold);
        let mut tx = self.write().await?;
        let existing =
            q(sql::ledger_get).bind(key.as_str()).fetch_optional(&mut *tx).await.map_err(|e| db(e, "ledger begin"))?;
        let Some(row) = existing else {
            q(sql::ledger_insert)
                .bind(key.as_str())
                .bind(&fingerprint)
                .bind(provider_key.as_uuid().to_string())
                .bind(&token)
                .bind(until)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "ledger begin"))?;
            tx.commit().await.map_err(|e| db(e, "commit ledger begin"))?;
            return Ok(Begin::Fresh(Hold { key: key.clone(), token, provider_key, lease: None }));
        };
        if row.get::<String, _>("fingerprint") != fingerprint {
            return Err(Error::new(ErrorKind::KeyConflict, format!("key {key} was used with a different payload")));
        }
        if row.get::<Option<i64>, _>("done_at").is_some() {
            let result = row.get::<Option<String>, _>("result").unwrap_or_else(|| "null".into());
            return Ok(Begin::Done(json_from(&result, "effect result")?));
        }
        let held_until = row.get::<Option<i64>, _>("held_until").unwrap_or(0);
        if held_until > now {
            return Ok(Begin::Busy(Duration::from_millis((held_until - now) as u64)));
        }
        let taken = q(sql::ledger_take)
            .bind(key.as_str())
            .bind(&token)
            .bind(until)
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(e, "ledger begin"))?;
        tx.commit().await.map_err(|e| db(e, "commit ledger begin"))?;
        let provider_key = provider_key_from(&taken.get::<String, _>("provider_key"))?;
        Ok(Begin::Resumed(Hold { key: key.clone(), token, provider_key, lease: None }))
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        let row = q(sql::ledger_extend)
            .bind(hold.key.as_str())
            .bind(&hold.token)
            .bind(now_ms() + ms(by))
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "extend a hold"))?;
        row.map(|_| ()).ok_or_else(|| {
            Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held by this attempt", hold.key))
        })
    }

    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        q(sql::ledger_release)
            .bind(hold.key.as_str())
            .bind(&hold.token)
            .bind(now_ms())
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "release a hold"))?;
        Ok(())
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        q(sql::ledger_finish)
            .bind(hold.key.as_str())
            .bind(result.to_string())
            .bind(now_ms())
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "finish"))?;
        Ok(())
    }
}
