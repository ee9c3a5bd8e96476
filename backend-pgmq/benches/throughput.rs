//! redrive-pgmq beside raw pgmq and redrive's Postgres backend, in the same round on the same
//! server (this machine's PostgreSQL, pgmq installed by `scripts/services`).
//!
//! ```sh
//! cargo bench -p redrive-pgmq --bench throughput            # 3 rounds, ~4 minutes plus the build
//! REDRIVE_BENCH_ROUNDS=1 cargo bench -p redrive-pgmq --bench throughput
//! REDRIVE_BENCH_QUICK=1 cargo bench -p redrive-pgmq --bench throughput   # the default burn-down only
//! ```
//!
//! Each round, interleaved, on 20k no-op jobs:
//! - **raw pgmq**: pgbench (`-M prepared -c 8 -j 2`), each transaction `pgmq.read` of 100 and
//!   `pgmq.delete` of what it read, until the 20k messages (redrive's own envelopes, sent with
//!   `pgmq.send_batch`) are gone; and `pgmq.send_batch` of 100 for enqueue. No keys, no ledger.
//! - **redrive-pgmq**: the default worker (concurrency 8; claim batch as configured, and 100)
//!   burning down 20k jobs enqueued beforehand, with the key table, fenced settlements and the
//!   effect ledger on (they cannot be turned off); `enqueue_batch` of 100 from 8 tasks.
//! - **redrive-postgres**: the same burn-down on the Postgres backend.
//!
//! Production conditions: every backlog is `VACUUM ANALYZE`d (pgmq's table, the key table, the
//! ledger) and checkpointed before it is measured; then an **autovacuum-on** variant (the
//! server's autovacuum on with a 1 s naptime, per-table thresholds of 1000 rows) of the raw and
//! the redrive-pgmq burn-downs, the settings restored after. Ratios are to raw pgmq's burn-down
//! (or send) in the same round.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redrive_core::kit::Envelope;
use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats, Worker, WorkerConfig};
use redrive_pgmq::{PgmqBackend, PgmqConfig};
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::process::Command;
use tokio::sync::Notify;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const JOBS: u64 = 20_000;
const BATCH: u64 = 100;
const CLIENTS: u64 = 8;
const TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl Job for Noop {
    const KIND: &'static str = "bench_noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

fn noop(n: u64) -> NewJob {
    NewJob::from_job(&Noop { n }).expect("a no-op job")
}

struct Ctx {
    url: String,
    admin: PgPool,
    dir: PathBuf,
    next: AtomicU64,
    autovacuum: bool,
}

impl Ctx {
    fn name(&self, what: &str) -> String {
        format!("rdbench_{what}_{}_{}", std::process::id(), self.next.fetch_add(1, Ordering::Relaxed))
    }

    async fn sql(&self, sql: String) -> BoxResult<()> {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await?;
        Ok(())
    }

    /// What autovacuum and the checkpointer do on a live database after a bulk enqueue; with the
    /// autovacuum variant on, thresholds low enough that it runs during the burn-down.
    async fn production(&self, tables: &[String]) -> BoxResult<()> {
        for table in tables {
            self.sql(format!("VACUUM ANALYZE {table}")).await?;
            if self.autovacuum {
                self.sql(format!(
                    "ALTER TABLE {table} SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0, \
                     autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0, \
                     autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0, \
                     autovacuum_vacuum_cost_delay = 0)"
                ))
                .await?;
            }
        }
        self.sql("CHECKPOINT".into()).await
    }

    /// Runs a pgbench script of `transactions` per client; its tps.
    async fn pgbench(&self, name: &str, script: &str, transactions: u64) -> BoxResult<f64> {
        let path = self.dir.join(format!("{name}.sql"));
        std::fs::write(&path, script)?;
        let out = Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-c", &CLIENTS.to_string(), "-j", "2", "-t", &transactions.to_string()])
            .arg("-f")
            .arg(&path)
            .arg(&self.url)
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("pgbench {name}: {stdout}{}", String::from_utf8_lossy(&out.stderr)).into());
        }
        if let Some(failed) = stdout.lines().find(|l| l.starts_with("number of failed") && !l.contains(": 0 ")) {
            return Err(format!("pgbench {name}: {failed}").into());
        }
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("no `tps = ` in pgbench's output:\n{stdout}").into())
    }
}

/// The envelope redrive sends for job `n`, as pgmq stores it.
fn envelope(n: u64) -> serde_json::Value {
    serde_json::to_value(Envelope::new(&noop(n))).expect("an envelope is JSON")
}

/// Raw pgmq: 20k envelopes sent, then read and deleted by pgbench in batches of 100; jobs/s.
async fn raw_burn(ctx: &Ctx) -> BoxResult<f64> {
    let queue = ctx.name("raw");
    sqlx::query("SELECT pgmq.create($1)").bind(&queue).execute(&ctx.admin).await?;
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(1000) {
        let messages: Vec<serde_json::Value> = chunk.iter().map(|&n| envelope(n)).collect();
        sqlx::query("SELECT pgmq.send_batch($1, $2::jsonb[])").bind(&queue).bind(&messages).execute(&ctx.admin).await?;
    }
    ctx.production(&[format!("pgmq.q_{queue}")]).await?;
    let script = format!(
        "SELECT coalesce(array_agg(msg_id), '{{}}')::text AS ids FROM pgmq.read('{queue}', 30, {BATCH}) \\gset\n\
         SELECT pgmq.delete('{queue}', :ids::bigint[]);\n"
    );
    let transactions = JOBS / BATCH / CLIENTS;
    let tps = ctx.pgbench("raw_burn", &script, transactions).await?;
    let left: i64 =
        sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM pgmq.q_{queue}"))).fetch_one(&ctx.admin).await?.get(0);
    sqlx::query("SELECT pgmq.drop_queue($1)").bind(&queue).execute(&ctx.admin).await?;
    // Jobs per transaction: what was read, 100 unless a read came back short.
    let done = JOBS - left as u64;
    Ok(tps * done as f64 / (transactions * CLIENTS) as f64)
}

/// Raw pgmq: `pgmq.send_batch` of 100 envelopes per transaction; jobs/s.
async fn raw_send(ctx: &Ctx) -> BoxResult<f64> {
    let queue = ctx.name("rawsend");
    sqlx::query("SELECT pgmq.create($1)").bind(&queue).execute(&ctx.admin).await?;
    ctx.sql("CHECKPOINT".into()).await?;
    // The envelope from a table: its JSON's colons would read as pgbench variables.
    let template = ctx.name("envelope");
    ctx.sql(format!("CREATE TABLE {template} (message jsonb)")).await?;
    sqlx::query(AssertSqlSafe(format!("INSERT INTO {template} VALUES ($1)")))
        .bind(envelope(0))
        .execute(&ctx.admin)
        .await?;
    let script =
        format!("SELECT pgmq.send_batch('{queue}', array_fill((SELECT message FROM {template}), ARRAY[{BATCH}]));\n");
    let tps = ctx.pgbench("raw_send", &script, JOBS / BATCH / CLIENTS).await?;
    ctx.sql(format!("DROP TABLE {template}")).await?;
    sqlx::query("SELECT pgmq.drop_queue($1)").bind(&queue).execute(&ctx.admin).await?;
    Ok(tps * BATCH as f64)
}

/// A records store (the ledger) on a schema of its own, migrated.
async fn store(ctx: &Ctx) -> BoxResult<PgBackend> {
    let records = PgBackend::connect(PgConfig::new(&ctx.url).with_schema(ctx.name("s"))).await?;
    records.migrate().await?;
    Ok(records)
}

async fn drop_store(ctx: &Ctx, records: PgBackend) -> BoxResult<()> {
    let schema = records.schema().to_owned();
    let pool = records.pool().clone();
    drop(records);
    tokio::spawn(async move { pool.close().await });
    ctx.sql(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await
}

async fn enqueue_all(queue: &(impl Enqueue + Clone + Send + Sync + 'static), jobs: u64, batch: u64) -> BoxResult<()> {
    let mut tasks = Vec::new();
    for task in 0..CLIENTS {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = task * batch;
            while n < jobs {
                queue.enqueue_batch((n..(n + batch).min(jobs)).map(noop).collect()).await?;
                n += CLIENTS * batch;
            }
            Ok::<_, redrive_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Starts a worker with no-op handlers and waits until they have run `JOBS` times; jobs/s.
async fn burn<Q, L>(queue: Q, ledger: L, config: WorkerConfig) -> BoxResult<f64>
where
    Q: redrive_core::kit::Claim + redrive_core::DeadLetter + Clone + 'static,
    L: redrive_core::kit::Ledger + Clone + 'static,
{
    let handled = Arc::new(AtomicU64::new(0));
    let all = Arc::new(Notify::new());
    let handler = {
        let (handled, all) = (Arc::clone(&handled), Arc::clone(&all));
        move |_job: Noop, _ctx: JobContext| {
            if handled.fetch_add(1, Ordering::Relaxed) + 1 == JOBS {
                all.notify_one();
            }
            async { Ok::<(), JobError>(()) }
        }
    };
    let start = Instant::now();
    let worker = Worker::builder(queue, ledger).config(config).handle::<Noop>(handler).build().start();
    let finished = tokio::time::timeout(TIMEOUT, all.notified()).await;
    let elapsed = start.elapsed();
    worker.shutdown().await;
    if finished.is_err() {
        return Err(format!("only {} of {JOBS} jobs ran in {TIMEOUT:?}", handled.load(Ordering::Relaxed)).into());
    }
    Ok(JOBS as f64 / elapsed.as_secs_f64())
}

/// redrive-pgmq: 20k jobs enqueued, then burned down by the worker; jobs/s.
async fn pgmq_burn(ctx: &Ctx, batch: Option<usize>) -> BoxResult<f64> {
    let records = store(ctx).await?;
    let queue = PgmqBackend::setup(PgmqConfig::new(ctx.name("q")), records.clone()).await?;
    enqueue_all(&queue, JOBS, 1000).await?;
    let schema = records.schema();
    ctx.production(&[
        format!("pgmq.q_{}", queue.queue_name()),
        format!("\"{schema}\".broker_keys"),
        format!("\"{schema}\".processed_keys"),
    ])
    .await?;
    let mut config = WorkerConfig { concurrency: CLIENTS as usize, ..WorkerConfig::default() };
    if let Some(batch) = batch {
        config.batch = batch;
    }
    let before = commits(ctx).await?;
    let rate = burn(queue.clone(), records.clone(), config).await?;
    let counts = queue.counts().await?;
    if counts.queued + counts.running != 0 {
        return Err(format!("messages left after the burn-down: {counts:?}").into());
    }
    // Its connections closed, so that their statistics are in.
    records.pool().close().await;
    let per_job = (commits(ctx).await? - before) / JOBS as f64;
    println!("- redrive-pgmq burn-down (batch {batch:?}): {rate:.0} jobs/s, {per_job:.3} commits per job");
    sqlx::query("SELECT pgmq.drop_queue($1)").bind(queue.queue_name()).execute(&ctx.admin).await?;
    drop(queue);
    drop_store(ctx, records).await?;
    Ok(rate)
}

/// Transactions committed in the database so far (by connections that closed or went idle: the
/// statistics settle for a moment first).
async fn commits(ctx: &Ctx) -> BoxResult<f64> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&ctx.admin).await?;
    let row = sqlx::query("SELECT xact_commit::float8 AS n FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&ctx.admin)
        .await?;
    Ok(row.get("n"))
}

/// redrive-pgmq: `enqueue_batch` of 100 from 8 tasks, keys and all; jobs/s.
async fn pgmq_send(ctx: &Ctx) -> BoxResult<f64> {
    let records = store(ctx).await?;
    let queue = PgmqBackend::setup(PgmqConfig::new(ctx.name("q")), records.clone()).await?;
    ctx.sql("CHECKPOINT".into()).await?;
    let start = Instant::now();
    enqueue_all(&queue, JOBS, BATCH).await?;
    let rate = JOBS as f64 / start.elapsed().as_secs_f64();
    sqlx::query("SELECT pgmq.drop_queue($1)").bind(queue.queue_name()).execute(&ctx.admin).await?;
    drop(queue);
    drop_store(ctx, records).await?;
    Ok(rate)
}

/// redrive-postgres: the same burn-down on the Postgres backend; jobs/s.
async fn postgres_burn(ctx: &Ctx) -> BoxResult<f64> {
    let backend = store(ctx).await?;
    enqueue_all(&backend, JOBS, 1000).await?;
    let schema = backend.schema();
    ctx.production(&[format!("\"{schema}\".jobs"), format!("\"{schema}\".job_keys")]).await?;
    let config = WorkerConfig { concurrency: CLIENTS as usize, ..WorkerConfig::default() };
    let before = commits(ctx).await?;
    let rate = burn(backend.clone(), backend.clone(), config).await?;
    // Not its LISTEN connection, which is returned only when its task next wakes.
    let _ = tokio::time::timeout(Duration::from_secs(2), backend.pool().close()).await;
    let per_job = (commits(ctx).await? - before) / JOBS as f64;
    println!("- redrive-postgres burn-down: {rate:.0} jobs/s, {per_job:.3} commits per job");
    drop_store(ctx, backend).await?;
    Ok(rate)
}

/// The server's autovacuum on (1 s naptime) for the variant, and back off after.
async fn autovacuum(admin: &PgPool, on: bool) -> BoxResult<()> {
    for sql in if on {
        ["ALTER SYSTEM SET autovacuum = on", "ALTER SYSTEM SET autovacuum_naptime = 1"]
    } else {
        ["ALTER SYSTEM RESET autovacuum", "ALTER SYSTEM RESET autovacuum_naptime"]
    } {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(admin).await?;
    }
    sqlx::query("SELECT pg_reload_conf()").execute(admin).await?;
    Ok(())
}

/// Drops the queues and schemas that interrupted runs left behind (their process is gone).
async fn drop_stale(ctx: &Ctx) -> BoxResult<()> {
    let gone = |name: &str| {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        !pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let queues = sqlx::query("SELECT queue_name FROM pgmq.meta WHERE queue_name LIKE 'rdbench\\_%'")
        .fetch_all(&ctx.admin)
        .await?;
    for name in queues.iter().map(|r| r.get::<String, _>(0)).filter(|n| gone(n)) {
        sqlx::query("SELECT pgmq.drop_queue($1)").bind(name).execute(&ctx.admin).await?;
    }
    let schemas =
        sqlx::query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rdbench\\_%'").fetch_all(&ctx.admin).await?;
    for name in schemas.iter().map(|r| r.get::<String, _>(0)).filter(|n| gone(n)) {
        ctx.sql(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await?;
    }
    Ok(())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rounds: usize = std::env::var("REDRIVE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let admin = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    let dir = std::env::temp_dir().join(format!("redrive-pgmq-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut ctx = Ctx { url, admin, dir, next: AtomicU64::new(0), autovacuum: false };
    drop_stale(&ctx).await?;

    if std::env::var_os("REDRIVE_BENCH_QUICK").is_some() {
        // For tuning: the default burn-down alone.
        pgmq_burn(&ctx, None).await?;
        return Ok(());
    }
    println!("# redrive-pgmq throughput: {JOBS} no-op jobs, {CLIENTS} clients / handlers, batch {BATCH}");
    let labels = [
        "raw pgmq: read 100 + delete (pgbench)",
        "redrive-pgmq: default worker",
        "redrive-pgmq: worker, claim batch 100",
        "redrive-postgres: default worker",
        "raw pgmq: send_batch 100 (pgbench)",
        "redrive-pgmq: enqueue_batch 100",
        "autovacuum on: raw pgmq read 100 + delete",
        "autovacuum on: redrive-pgmq default worker",
    ];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    for round in 1..=rounds {
        ctx.autovacuum = false;
        let mut these = vec![
            raw_burn(&ctx).await?,
            pgmq_burn(&ctx, None).await?,
            pgmq_burn(&ctx, Some(BATCH as usize)).await?,
            postgres_burn(&ctx).await?,
            raw_send(&ctx).await?,
            pgmq_send(&ctx).await?,
        ];
        autovacuum(&ctx.admin, true).await?;
        ctx.autovacuum = true;
        let variant = async {
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((raw_burn(&ctx).await?, pgmq_burn(&ctx, None).await?))
        }
        .await;
        autovacuum(&ctx.admin, false).await?;
        let (raw, pgmq) = variant?;
        these.extend([raw, pgmq]);
        println!("\n## round {round}\n\n| cell | jobs/s | ratio |\n|---|---:|---:|");
        for (n, (label, rate)) in labels.iter().zip(&these).enumerate() {
            // Burn-downs against the raw burn-down, sends against the raw send, the variant
            // against its own raw run.
            let base = match n {
                0..=3 => these[0],
                4 | 5 => these[4],
                _ => these[6],
            };
            println!("| {label} | {rate:.0} | {:.2}× |", rate / base);
            figures[n].push(*rate);
        }
    }
    if rounds > 1 {
        let medians: Vec<f64> = figures.into_iter().map(median).collect();
        println!("\n## median of {rounds} rounds\n\n| cell | jobs/s | ratio |\n|---|---:|---:|");
        for (n, label) in labels.iter().enumerate() {
            let base = match n {
                0..=3 => medians[0],
                4 | 5 => medians[4],
                _ => medians[6],
            };
            println!("| {label} | {:.0} | {:.2}× |", medians[n], medians[n] / base);
        }
    }
    std::fs::remove_dir_all(&ctx.dir)?;
    Ok(())
}
