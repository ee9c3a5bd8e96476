//! Throughput of the Postgres backend, stated as ratios to raw SQL measured in the same round.
//!
//! ```text
//! cargo bench -p redrive-postgres --bench throughput
//! ```
//!
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) for redrive's own
//! schemas, and a database `redrive_bench` on the same server for the pgbench baselines. Needs
//! `psql` and `pgbench` on the PATH and the scripts of `shared/bench` (found beside the workspace,
//! or in `REDRIVE_BENCH_SQL_DIR`).
//!
//! One round, under production conditions: every backlog is analyzed (`VACUUM ANALYZE`, what
//! autovacuum does on a live database after a bulk enqueue) and checkpointed before it is burned
//! down. lifecycle.sql and batch100.sql; worker burn-downs (20k jobs, four batch sizes); backlogs
//! of 2k, 200k and 1M; the same with autovacuum on (turned on for the section with aggressive
//! per-table thresholds, and the server's settings restored after); 1, 2 and 4 worker processes
//! on one queue; a worker process killed with a full buffer; enqueue → start latency, idle and
//! behind a 200k backlog; enqueue throughput; a long run of 2M jobs through one table with
//! `prune_done` and autovacuum on; lifecycle.sql again. These machines are noisy, so every figure
//! is divided by the mean of the round's two lifecycle.sql runs; both are printed so that drift
//! within the round shows. The default configuration's burn-downs and the process counts run
//! three times each and report the median; every run is printed. Each measured phase, pgbench's
//! included, starts after a CHECKPOINT, so that none pays for the dirty pages of the one before.
//!
//! `REDRIVE_BENCH_ONLY=processes,long` runs only those sections (`burn`, `backlog`,
//! `autovacuum`, `flow`, `order`, `priority`, `processes`, `kill`, `latency`, `enqueue`, `long`) between the two
//! baselines;
//! `REDRIVE_BENCH_LONG_JOBS` and `REDRIVE_BENCH_SCALE_JOBS` change those sections' sizes. For
//! tuning, `REDRIVE_BENCH_QUICK=1` runs lifecycle.sql and the default burn-down only;
//! `REDRIVE_BENCH_JOBS`, `REDRIVE_BENCH_BATCH` and `REDRIVE_BENCH_CLAIMERS` then change it.

mod flow;
mod production;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_core::{
    Enqueue, Flow, Handler, Job, JobContext, JobError, KeyBuilder, Limits, NewJob, RunningWorker, Worker, WorkerConfig,
    WorkerStats,
};
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};
use tokio::process::Command;
use tokio::sync::Notify;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Jobs per worker burn-down, and the larger backlog.
const BURN_JOBS: u64 = 20_000;
const SMALL_BACKLOG: u64 = 2_000;
const LARGE_BACKLOG: u64 = 200_000;
const MILLION: u64 = 1_000_000;
/// Jobs per burn-down by several worker processes.
const SCALE_OUT_JOBS: u64 = 200_000;
/// Jobs through one table in the long run (`REDRIVE_BENCH_LONG_JOBS` overrides).
const LONG_RUN_JOBS: u64 = 2_000_000;
/// Jobs per `enqueue_batch` call when pre-inserting a backlog.
const INSERT_CHUNK: u64 = 1_000;
const CONCURRENCY: usize = 8;
/// Runs of the default configuration's burn-downs, of which the median is reported.
const DEFAULT_RUNS: usize = 3;
/// Seconds per pgbench run (the README's 15 s, shortened to keep a round under ~4 minutes).
const PGBENCH_SECS: u32 = 10;
const ENQUEUE_TASKS: usize = 8;
const ENQUEUE_FOR: Duration = Duration::from_secs(5);
/// Give up on a burn-down after this long and report the partial rate, so that a slow backend
/// cannot stretch a round past its budget.
const BURN_TIMEOUT: Duration = Duration::from_secs(45);
const LARGE_BURN_TIMEOUT: Duration = Duration::from_secs(90);
const MILLION_TIMEOUT: Duration = Duration::from_secs(240);

/// The no-op job every scenario runs.
#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
    /// The flow section's tenant (`Job::limit_key`); absent elsewhere, so other payloads are as
    /// they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<u64>,
    /// The order section's account (`Job::order_key`); absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    account: Option<u64>,
}

/// How `noop` names tenants: 0, none; else this many consecutive jobs per tenant, 1,000 tenants
/// in turn (1: each job the next tenant). Set by the flow section around its backlogs.
static TENANT_RUN: AtomicU64 = AtomicU64::new(0);

/// How `noop` names accounts (order keys), as [`TENANT_RUN`] names tenants. Set by the order
/// section around its backlogs.
static ORDER_RUN: AtomicU64 = AtomicU64::new(0);

/// How many priorities `noop` spreads its jobs over, in turn (5: -20, -10, 0, 10, 20); 0, none.
/// Set by the priority section around its backlogs.
static PRIORITY_MIX: AtomicU64 = AtomicU64::new(0);

impl Job for Noop {
    const KIND: &'static str = "bench_noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }

    fn limit_key(&self) -> Option<String> {
        self.tenant.map(|t| format!("tenant{t}"))
    }

    fn order_key(&self) -> Option<String> {
        self.account.map(|a| format!("account{a}"))
    }
}

fn var_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn noop(n: u64) -> BoxResult<NewJob> {
    let run = TENANT_RUN.load(Ordering::Relaxed);
    let tenant = (run > 0).then(|| (n / run) % 1000);
    let order = ORDER_RUN.load(Ordering::Relaxed);
    let account = (order > 0).then(|| (n / order) % 1000);
    let job = NewJob::from_job(&Noop { n, tenant, account })?;
    let mix = PRIORITY_MIX.load(Ordering::Relaxed);
    if mix == 0 {
        return Ok(job);
    }
    let priority = ((n % mix) as i16 - (mix / 2) as i16) * 10;
    Ok(job.with_priority(priority)?)
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if let Ok(spec) = std::env::var("REDRIVE_BENCH_CHILD") {
        return production::child(&spec).await;
    }
    // Warnings from the worker or backend (lease lost, failed settlements) would explain odd
    // figures, so they are shown; RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let sql_dir = bench_sql_dir()?;
    let bench_url = with_database(&url, "redrive_bench");
    create_database(&url, "redrive_bench").await?;
    let ctx = Ctx::new(&url).await?;
    let round = Instant::now();

    println!("# redrive-postgres throughput");
    println!();
    println!("pgbench scripts: {}", sql_dir.display());
    println!("worker: no-op `Noop` jobs, concurrency {CONCURRENCY}, effect ledger and lease fencing on");
    println!();

    println!("## Raw-SQL baselines (pgbench -n -M prepared -c 8 -j 2 -T {PGBENCH_SECS})");
    let lifecycle_start = pgbench(&bench_url, &sql_dir, "lifecycle.sql", 1).await?;
    println!("- lifecycle.sql, start of round: {}", rate(lifecycle_start));
    let batch100 = pgbench(&bench_url, &sql_dir, "batch100.sql", 100).await?;
    println!("- batch100.sql: {}", rate(batch100));

    let mut rows: Vec<(String, Figure)> = vec![("pgbench batch100.sql".into(), Figure::Rate(batch100))];
    // REDRIVE_BENCH_QUICK=1: the default burn-down only, against the start baseline (for tuning).
    let quick = std::env::var_os("REDRIVE_BENCH_QUICK").is_some();
    // REDRIVE_BENCH_ONLY=processes,long: only those sections, between the two baselines.
    let only = std::env::var("REDRIVE_BENCH_ONLY").ok();
    let mut default_20k = f64::NAN;
    let wants = |section: &str| only.as_deref().is_none_or(|only| only.split(',').any(|s| s.trim() == section));

    if wants("burn") {
        println!();
        println!("## Worker burn-down: {BURN_JOBS} pre-inserted jobs, concurrency {CONCURRENCY}");
        let default_label = format!("default (batch = {})", WorkerConfig::default().batch);
        let configs = [
            (default_label.as_str(), None),
            ("batch = 1", Some(1)),
            ("batch = 10", Some(10)),
            ("batch = 100", Some(100)),
        ];
        // REDRIVE_BENCH_QUICK=1: the default burn-down only, against the start baseline (for tuning).
        for (label, batch) in configs.into_iter().take(if quick { 1 } else { 4 }) {
            let mut config = WorkerConfig { concurrency: CONCURRENCY, ..WorkerConfig::default() };
            if let Some(batch) = batch {
                config.batch = batch;
            }
            if quick {
                config.batch = var_u64("REDRIVE_BENCH_BATCH").map_or(config.batch, |b| b as usize);
                config.claimers = var_u64("REDRIVE_BENCH_CLAIMERS").map_or(config.claimers, |c| c as usize);
            }
            let jobs = if quick { var_u64("REDRIVE_BENCH_JOBS").unwrap_or(BURN_JOBS) } else { BURN_JOBS };
            // The default configuration is the headline figure: its median of three runs, so that one
            // run caught by a noisy moment does not make it.
            let runs = if batch.is_none() { DEFAULT_RUNS } else { 1 };
            let burn = median_burn(&ctx, &config, jobs, BURN_TIMEOUT, runs, label).await?;
            if batch.is_none() {
                default_20k = burn.rate();
            }
            rows.push((format!("burn-down 20k, {label}"), Figure::Rate(burn.rate())));
            if quick {
                println!("- ratio to lifecycle.sql (start of round): {:.2}×", burn.rate() / lifecycle_start);
                return Ok(());
            }
        }
    }
    if wants("backlog") {
        println!();
        println!("## Backlog size (default configuration)");
        let small =
            median_burn(&ctx, &default_config(), SMALL_BACKLOG, BURN_TIMEOUT, DEFAULT_RUNS, "2000 jobs").await?;
        let large = burn_down(&ctx, default_config(), LARGE_BACKLOG, LARGE_BURN_TIMEOUT).await?;
        println!("- {LARGE_BACKLOG} jobs: {}", large.describe());
        let million = burn_down(&ctx, default_config(), MILLION, MILLION_TIMEOUT).await?;
        println!("- {MILLION} jobs: {}", million.describe());
        let backlog_ratio = large.rate() / small.rate();
        let million_ratio = million.rate() / default_20k;
        println!("- 200k / 2k: {backlog_ratio:.2}×; 1M / 20k: {million_ratio:.2}×");
        rows.push(("burn-down 2k backlog".into(), Figure::Rate(small.rate())));
        rows.push(("burn-down 200k backlog".into(), Figure::Rate(large.rate())));
        rows.push(("burn-down 1M backlog".into(), Figure::Rate(million.rate())));
        rows.push(("backlog 200k ÷ 2k".into(), Figure::Plain(format!("{backlog_ratio:.2}×"))));
        rows.push(("backlog 1M ÷ 20k".into(), Figure::Plain(format!("{million_ratio:.2}×"))));
    }
    if wants("autovacuum") {
        println!();
        println!("## Autovacuum on (naptime 1 s, per-table thresholds of 1000 rows), default configuration");
        let (autovacuum_20k, autovacuum_200k) = production::with_autovacuum(&ctx, async {
            let small =
                median_burn(&ctx, &default_config(), BURN_JOBS, BURN_TIMEOUT, DEFAULT_RUNS, "20000 jobs").await?;
            let large = burn_down(&ctx, default_config(), LARGE_BACKLOG, LARGE_BURN_TIMEOUT).await?;
            println!("- {LARGE_BACKLOG} jobs: {}", large.describe());
            Ok((small.rate(), large.rate()))
        })
        .await?;
        rows.push(("burn-down 20k, autovacuum on".into(), Figure::Rate(autovacuum_20k)));
        rows.push(("burn-down 200k, autovacuum on".into(), Figure::Rate(autovacuum_200k)));
    }
    if wants("flow") {
        rows.extend(flow::section(&ctx, lifecycle_start).await?);
    }
    if wants("order") {
        rows.extend(flow::order_section(&ctx, lifecycle_start).await?);
    }
    if wants("priority") {
        rows.extend(flow::priority_section(&ctx, lifecycle_start).await?);
    }
    if wants("processes") {
        println!();
        println!("## Worker processes on one queue: {SCALE_OUT_JOBS} jobs, {CONCURRENCY} handlers in all");
        // Interleaved (1, 2, 4, 1, 2, 4, …) so that the machine's drift falls on every count alike;
        // the median of each is reported.
        let scale_jobs = var_u64("REDRIVE_BENCH_SCALE_JOBS").unwrap_or(SCALE_OUT_JOBS);
        let mut runs: HashMap<usize, Vec<production::ScaleOut>> = HashMap::new();
        for _ in 0..DEFAULT_RUNS {
            for processes in [1, 2, 4] {
                runs.entry(processes).or_default().push(production::scale_out(&ctx, processes, scale_jobs).await?);
            }
        }
        let median = |processes: usize| {
            let mut rates: Vec<f64> = runs[&processes].iter().map(|r| r.rate).collect();
            rates.sort_by(f64::total_cmp);
            rates[rates.len() / 2]
        };
        let one_process = median(1);
        for processes in [1, 2, 4] {
            let duplicates: i64 = runs[&processes].iter().map(|r| r.duplicates).sum();
            let ratio = median(processes) / one_process;
            println!(
                "- {processes} process(es), median: {} ({ratio:.2}× of 1 process), duplicates {duplicates}",
                rate(median(processes))
            );
            rows.push((format!("{processes} process(es), median of {DEFAULT_RUNS}"), Figure::Rate(median(processes))));
            rows.push((
                format!("{processes} process(es): ÷ 1 process, duplicates"),
                Figure::Plain(format!("{ratio:.2}×, {duplicates}")),
            ));
        }
    }
    if wants("kill") {
        println!();
        println!("## A worker killed (SIGKILL) holding a full buffer; another takes over");
        let killed = production::killed_worker(&ctx).await?;
        rows.push((
            "killed worker: stranded jobs, back within".into(),
            Figure::Plain(format!(
                "{}, {:.1} s (started ones: {:.1} s)",
                killed.stranded,
                killed.unstarted_back.as_secs_f64(),
                killed.all_back.as_secs_f64()
            )),
        ));
    }
    if wants("latency") {
        println!();
        println!("## Latency, enqueue call → handler start (idle worker, enqueues from one task)");
        let notify = latency(&ctx, PgConfig::new(&url), 300, Duration::from_millis(3)).await?;
        println!("- LISTEN/NOTIFY, 300 jobs ~3 ms apart: {}", notify.describe());
        // At 3 ms apart, 100 jobs would all land within one 1 s poll cycle and sample a single phase
        // of it; 37 ms apart (prime to 1000) they spread over ~4 cycles and sample its phases evenly.
        let polling = latency(&ctx, PgConfig::new(&url).with_listen(false), 100, Duration::from_millis(37)).await?;
        println!("- polling only (1 s), 100 jobs ~37 ms apart: {}", polling.describe());
        let behind = production::latency_behind_backlog(&ctx, LARGE_BACKLOG).await?;
        println!("- one job every 20 ms while a {LARGE_BACKLOG}-job backlog drains: {}", behind.describe());
        for (label, l) in [("NOTIFY", &notify), ("polling only", &polling), ("behind a 200k backlog", &behind)] {
            rows.push((format!("latency p50, {label}"), Figure::Ms(l.p50)));
            rows.push((format!("latency p99, {label}"), Figure::Ms(l.p99)));
        }
    }
    if wants("enqueue") {
        println!();
        println!("## Enqueue throughput ({ENQUEUE_TASKS} tasks, {} s each)", ENQUEUE_FOR.as_secs());
        let single = enqueue_rate(&ctx, 1).await?;
        println!("- single `enqueue`: {}", rate(single));
        let batched = enqueue_rate(&ctx, 100).await?;
        println!("- `enqueue_batch` of 100: {}", rate(batched));
        rows.push(("enqueue, single".into(), Figure::Rate(single)));
        rows.push(("enqueue_batch of 100".into(), Figure::Rate(batched)));
    }
    if wants("long") {
        let long_jobs = var_u64("REDRIVE_BENCH_LONG_JOBS").unwrap_or(LONG_RUN_JOBS);
        if long_jobs > 0 {
            println!();
            println!(
                "## Long run: {long_jobs} jobs through one table, a producer ahead, prune_done every second, autovacuum on"
            );
            let rates = production::with_autovacuum(&ctx, production::long_run(&ctx, long_jobs)).await?;
            let (first, last) = (rates.first().copied().unwrap_or(f64::NAN), rates.last().copied().unwrap_or(f64::NAN));
            rows.push(("long run, first window".into(), Figure::Rate(first)));
            rows.push(("long run, last window".into(), Figure::Rate(last)));
        }
    }
    println!();
    println!("## Raw-SQL baseline again, end of round");
    let lifecycle_end = pgbench(&bench_url, &sql_dir, "lifecycle.sql", 1).await?;
    println!("- lifecycle.sql, end of round: {}", rate(lifecycle_end));
    let lifecycle = (lifecycle_start + lifecycle_end) / 2.0;
    let drift = (lifecycle_end - lifecycle_start) / lifecycle_start * 100.0;
    println!("- lifecycle.sql mean (the denominator): {} (end vs start: {drift:+.1}%)", rate(lifecycle));

    println!();
    println!("## Summary (round took {:.0} s)", round.elapsed().as_secs_f64());
    println!();
    println!("| figure | value | ratio to lifecycle.sql |");
    println!("|---|---:|---:|");
    let mut all = vec![
        ("pgbench lifecycle.sql, start".to_owned(), Figure::Rate(lifecycle_start)),
        ("pgbench lifecycle.sql, end".to_owned(), Figure::Rate(lifecycle_end)),
        ("pgbench lifecycle.sql, mean".to_owned(), Figure::Rate(lifecycle)),
    ];
    all.extend(rows);
    for (name, figure) in all {
        let (value, ratio) = match figure {
            Figure::Rate(r) => (rate(r), format!("{:.3}×", r / lifecycle)),
            Figure::Ms(ms) => (format!("{ms:.1} ms"), "–".into()),
            Figure::Plain(s) => (s, "–".into()),
        };
        println!("| {name} | {value} | {ratio} |");
    }
    Ok(())
}

enum Figure {
    /// Jobs per second, shown with its ratio to lifecycle.sql.
    Rate(f64),
    Ms(f64),
    Plain(String),
}

fn rate(jobs_per_sec: f64) -> String {
    format!("{jobs_per_sec:.0} jobs/s")
}

fn default_config() -> WorkerConfig {
    WorkerConfig { concurrency: CONCURRENCY, ..WorkerConfig::default() }
}

/// A worker in the default configuration running `handler` on `backend`.
fn start_default(backend: &PgBackend, handler: impl Handler<Noop>) -> RunningWorker {
    Worker::builder(backend.clone(), backend.clone()).config(default_config()).handle::<Noop>(handler).build().start()
}

// ---------------------------------------------------------------------------------------------
// pgbench baselines

/// `$CARGO_MANIFEST_DIR/../../shared/bench`, else `REDRIVE_BENCH_SQL_DIR`.
fn bench_sql_dir() -> BoxResult<PathBuf> {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/bench");
    if beside.join("lifecycle.sql").is_file() {
        return Ok(beside.canonicalize()?);
    }
    match std::env::var_os("REDRIVE_BENCH_SQL_DIR") {
        Some(dir) if Path::new(&dir).join("lifecycle.sql").is_file() => Ok(dir.into()),
        _ => {
            Err(format!("no pgbench scripts in {} and REDRIVE_BENCH_SQL_DIR is unset or wrong", beside.display())
                .into())
        }
    }
}

/// The same URL naming database `db` instead (user, host, port and parameters kept).
fn with_database(url: &str, db: &str) -> String {
    let (base, params) = match url.split_once('?') {
        Some((base, params)) => (base, Some(params)),
        None => (url, None),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let path = base[authority..].find('/').map_or(base.len(), |i| authority + i);
    let mut out = format!("{}/{db}", &base[..path]);
    if let Some(params) = params {
        out.push('?');
        out.push_str(params);
    }
    out
}

/// Creates database `db` unless it exists, from the server's `postgres` database.
async fn create_database(url: &str, db: &str) -> BoxResult<()> {
    let mut conn = PgConnection::connect(&with_database(url, "postgres")).await?;
    let exists = sqlx::query("SELECT 1 FROM pg_database WHERE datname = $1").bind(db).fetch_optional(&mut conn).await?;
    if exists.is_none() {
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db}\""))).execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(())
}

/// Loads schema.sql afresh (so every run starts from the same 20k queued rows), runs `script`
/// with pgbench, and returns jobs/s (`jobs_per_tx` × tps).
async fn pgbench(url: &str, dir: &Path, script: &str, jobs_per_tx: u32) -> BoxResult<f64> {
    let load = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(dir.join("schema.sql"))
        .args(["-c", "CHECKPOINT"])
        .arg(url)
        .output()
        .await?;
    if !load.status.success() {
        return Err(format!("psql schema.sql failed: {}", String::from_utf8_lossy(&load.stderr)).into());
    }
    let secs = PGBENCH_SECS.to_string();
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", &secs, "-f"])
        .arg(dir.join(script))
        .arg(url)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("pgbench {script} failed: {stdout}{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let tps = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .ok_or_else(|| format!("no `tps = ` line in pgbench's output:\n{stdout}"))?;
    // A baseline whose transactions failed would flatter redrive: say so.
    if let Some(failed) = stdout.lines().find(|l| l.starts_with("number of failed transactions") && !l.contains(": 0 "))
    {
        eprintln!("warning: pgbench {script}: {failed}");
    }
    Ok(tps * f64::from(jobs_per_tx))
}

// ---------------------------------------------------------------------------------------------
// Fresh schemas for redrive

/// Makes a schema per scenario (`rdbench_<pid>_<n>`), so no scenario sees another's rows.
struct Ctx {
    url: String,
    /// For DDL and checks, apart from the backends' own pools.
    admin: PgPool,
    next: AtomicU32,
    /// While set, new schemas get per-table autovacuum thresholds that make it run within seconds.
    aggressive_autovacuum: AtomicBool,
}

impl Ctx {
    async fn new(url: &str) -> BoxResult<Self> {
        let admin = PgPoolOptions::new().max_connections(2).connect(url).await?;
        drop_stale_schemas(&admin).await?;
        Ok(Self { url: url.to_owned(), admin, next: AtomicU32::new(0), aggressive_autovacuum: AtomicBool::new(false) })
    }

    /// A migrated backend on a new schema; `config` is the default `PgConfig` to adjust.
    async fn backend(&self, config: PgConfig) -> BoxResult<PgBackend> {
        let schema = format!("rdbench_{}_{}", std::process::id(), self.next.fetch_add(1, Ordering::Relaxed));
        let backend = PgBackend::connect(config.with_schema(schema)).await?;
        backend.migrate().await?;
        if self.aggressive_autovacuum.load(Ordering::Relaxed) {
            production::aggressive_autovacuum(&self.admin, backend.schema()).await?;
        }
        Ok(backend)
    }

    async fn default_backend(&self) -> BoxResult<PgBackend> {
        self.backend(PgConfig::new(&self.url)).await
    }

    /// Drops the backend's schema and lets go of its pool.
    async fn discard(&self, backend: PgBackend) -> BoxResult<()> {
        let schema = backend.schema().to_owned();
        // Not awaited: the LISTEN connection is only returned when its task next wakes (≤ 30 s).
        let pool = backend.pool().clone();
        drop(backend);
        tokio::spawn(async move { pool.close().await });
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))).execute(&self.admin).await?;
        Ok(())
    }
}

/// Drops the schemas that earlier, interrupted runs left behind (their pid is gone).
async fn drop_stale_schemas(admin: &PgPool) -> BoxResult<()> {
    let rows =
        sqlx::query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rdbench\\_%'").fetch_all(admin).await?;
    for row in rows {
        let name: String = row.get(0);
        let pid: Option<u32> = name.split('_').nth(1).and_then(|p| p.parse().ok());
        if !pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
            sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))).execute(admin).await?;
        }
    }
    Ok(())
}

/// `jobs` no-op jobs, numbered from 0, in `enqueue_batch` calls of `INSERT_CHUNK` from four tasks.
async fn insert_backlog(backend: &PgBackend, jobs: u64) -> BoxResult<()> {
    const TASKS: u64 = 4;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            for first in (task * INSERT_CHUNK..jobs).step_by((TASKS * INSERT_CHUNK) as usize) {
                let chunk = (first..jobs.min(first + INSERT_CHUNK)).map(noop).collect::<BoxResult<Vec<_>>>()?;
                backend.enqueue_batch(chunk).await?;
            }
            BoxResult::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Worker burn-down

struct Burn {
    jobs: u64,
    handled: u64,
    elapsed: Duration,
    insert: Duration,
    stats: WorkerStats,
    /// Rows not `done` once the worker has shut down (0 unless the burn-down timed out).
    left: i64,
    /// CPU seconds spent during the burn-down by this process and by the server's processes.
    cpu: Option<(f64, f64)>,
    /// Autovacuum's vacuums and analyzes of `jobs` during the burn-down, when it is on.
    autovacuum: Option<(i64, i64)>,
}

impl Burn {
    fn rate(&self) -> f64 {
        self.handled as f64 / self.elapsed.as_secs_f64()
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "{} in {:.2} s (pre-insert {:.1} s)",
            rate(self.rate()),
            self.elapsed.as_secs_f64(),
            self.insert.as_secs_f64()
        );
        if self.handled < self.jobs {
            s.push_str(&format!(" — TIMED OUT: {} of {} handled", self.handled, self.jobs));
        }
        let st = &self.stats;
        if st.retried + st.deferred + st.lease_lost + st.dead_lettered + st.skipped + st.handed_back > 0 {
            s.push_str(&format!(
                " — unexpected: retried {}, deferred {}, lease lost {}, dead-lettered {}, skipped {}, handed back {}",
                st.retried, st.deferred, st.lease_lost, st.dead_lettered, st.skipped, st.handed_back
            ));
        }
        if self.left > 0 && self.handled == self.jobs {
            s.push_str(&format!(" — {} rows not done after shutdown", self.left));
        }
        if let Some((worker, server)) = self.cpu {
            let per_job = |secs: f64| secs * 1e6 / self.handled.max(1) as f64;
            s.push_str(&format!("; CPU per job: worker {:.0} µs, server {:.0} µs", per_job(worker), per_job(server)));
        }
        if let Some((vacuums, analyzes)) = self.autovacuum {
            s.push_str(&format!("; autovacuum ran {vacuums} vacuums and {analyzes} analyzes of jobs meanwhile"));
        }
        s
    }
}

/// Writes out dirty pages, so that a measurement does not pay for the one before it (every
/// measured phase, pgbench's included, starts after one).
async fn checkpoint(admin: &PgPool) -> BoxResult<()> {
    sqlx::query("CHECKPOINT").execute(admin).await?;
    Ok(())
}

/// What autovacuum does on a live database as soon as a bulk enqueue has changed enough rows:
/// statistics that say every job is queued, and a visibility map. Production conditions.
async fn analyze(admin: &PgPool, schema: &str) -> BoxResult<()> {
    if std::env::var_os("REDRIVE_BENCH_NO_ANALYZE").is_some() {
        return Ok(());
    }
    for table in ["jobs", "job_keys"] {
        sqlx::query(AssertSqlSafe(format!("VACUUM ANALYZE \"{schema}\".{table}"))).execute(admin).await?;
    }
    Ok(())
}

/// CPU seconds used so far by this process and by all `postgres` processes on this machine, read
/// from `/proc` (Linux only; `None` elsewhere). Shows where a burn-down's time goes: the two
/// cores are shared between the worker and the server.
fn cpu_seconds() -> Option<(f64, f64)> {
    let own = process_cpu("self")?;
    let mut server = 0.0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let path = entry.path();
        if std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == "postgres") {
            server += path.file_name().and_then(|p| p.to_str()).and_then(process_cpu).unwrap_or(0.0);
        }
    }
    Some((own, server))
}

/// CPU seconds used so far by process `pid` (`self` for this one), from `/proc/<pid>/stat`.
fn process_cpu(pid: &str) -> Option<f64> {
    const TICKS_PER_SEC: f64 = 100.0; // USER_HZ, 100 on Linux
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / TICKS_PER_SEC)
}

/// Runs [`burn_down`] `runs` times, prints each run, and returns the one with the median rate.
async fn median_burn(
    ctx: &Ctx,
    config: &WorkerConfig,
    jobs: u64,
    timeout: Duration,
    runs: usize,
    label: &str,
) -> BoxResult<Burn> {
    let mut burns = Vec::with_capacity(runs);
    for run in 1..=runs {
        let burn = burn_down(ctx, config.clone(), jobs, timeout).await?;
        let of = if runs > 1 { format!(" (run {run} of {runs})") } else { String::new() };
        println!("- {label}{of}: {}", burn.describe());
        burns.push(burn);
    }
    burns.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let median = burns.swap_remove(runs / 2);
    if runs > 1 {
        println!("- {label}, median: {}", rate(median.rate()));
    }
    Ok(median)
}

/// Pre-inserts `jobs` into a fresh schema, then times a worker from its start until its handler
/// has run `jobs` times (or `timeout` passes).
async fn burn_down(ctx: &Ctx, config: WorkerConfig, jobs: u64, timeout: Duration) -> BoxResult<Burn> {
    burn_down_limited(ctx, config, jobs, timeout, Limits::default(), 0).await
}

/// [`burn_down`] with `limits` set on the job kind in the flow store before the worker starts.
async fn burn_down_limited(
    ctx: &Ctx,
    config: WorkerConfig,
    jobs: u64,
    timeout: Duration,
    limits: Limits,
    tenant_run: u64,
) -> BoxResult<Burn> {
    let backend = ctx.default_backend().await?;
    let t = Instant::now();
    TENANT_RUN.store(tenant_run, Ordering::Relaxed);
    let inserted = insert_backlog(&backend, jobs).await;
    TENANT_RUN.store(0, Ordering::Relaxed);
    inserted?;
    let insert = t.elapsed();
    if !limits.is_none() {
        backend.set_limits("bench_noop", &limits, "bench").await?;
    }
    analyze(&ctx.admin, backend.schema()).await?;
    checkpoint(&ctx.admin).await?;

    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let handler = {
        let (handled, all_handled) = (Arc::clone(&handled), Arc::clone(&all_handled));
        move |_job: Noop, _ctx: JobContext| {
            // notify_one keeps a permit, so the waiter cannot miss it.
            if handled.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                all_handled.notify_one();
            }
            async { Ok::<(), JobError>(()) }
        }
    };
    let autovacuum_on = ctx.aggressive_autovacuum.load(Ordering::Relaxed);
    let runs_before =
        if autovacuum_on { Some(production::autovacuum_runs(&ctx.admin, backend.schema()).await?) } else { None };
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let worker =
        Worker::builder(backend.clone(), backend.clone()).config(config).handle::<Noop>(handler).build().start();
    let _ = tokio::time::timeout(timeout, all_handled.notified()).await;
    let elapsed = start.elapsed();
    let cpu = cpu_before.zip(cpu_seconds()).map(|((w0, s0), (w1, s1))| (w1 - w0, s1 - s0));
    let handled = handled.load(Ordering::Relaxed);
    let stats = worker.shutdown().await;
    let autovacuum = match runs_before {
        Some((v0, a0)) => {
            let (v1, a1) = production::autovacuum_runs(&ctx.admin, backend.schema()).await?;
            Some((v1 - v0, a1 - a0))
        }
        None => None,
    };

    let left: i64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".jobs WHERE status <> 'done'",
        backend.schema()
    )))
    .fetch_one(&ctx.admin)
    .await?
    .get(0);
    ctx.discard(backend).await?;
    Ok(Burn { jobs, handled, elapsed, insert, stats, left, cpu, autovacuum })
}

// ---------------------------------------------------------------------------------------------
// Latency

struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
    seen: usize,
    sent: usize,
}

impl Latency {
    /// From sorted milliseconds, of `sent` jobs.
    fn of(sorted_ms: &[f64], sent: usize) -> Self {
        Self {
            p50: percentile(sorted_ms, 50.0),
            p99: percentile(sorted_ms, 99.0),
            max: sorted_ms.last().copied().unwrap_or(f64::NAN),
            seen: sorted_ms.len(),
            sent,
        }
    }

    fn describe(&self) -> String {
        let mut s = format!("p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", self.p50, self.p99, self.max);
        if self.seen < self.sent {
            s.push_str(&format!(" — only {} of {} jobs started", self.seen, self.sent));
        }
        s
    }
}

/// An idle worker on an empty schema; `jobs` single enqueues `spacing` apart from one task.
/// Measures from just before each `enqueue` call to the start of its handler.
async fn latency(ctx: &Ctx, config: PgConfig, jobs: u64, spacing: Duration) -> BoxResult<Latency> {
    let backend = ctx.backend(config).await?;
    let started = Arc::new(Mutex::new(HashMap::<u64, Instant>::new()));
    let all_started = Arc::new(Notify::new());
    let handler = {
        let (started, all_started) = (Arc::clone(&started), Arc::clone(&all_started));
        move |job: Noop, _ctx: JobContext| {
            let now = Instant::now();
            let mut started = started.lock().unwrap_or_else(|p| p.into_inner());
            started.insert(job.n, now);
            if started.len() as u64 == jobs {
                all_started.notify_one();
            }
            async { Ok::<(), JobError>(()) }
        }
    };
    let worker = start_default(&backend, handler);
    // Long enough for the first claim to find nothing and (with NOTIFY) for LISTEN to be set up.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut sent = Vec::with_capacity(jobs as usize);
    let mut tick = tokio::time::interval(spacing);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..jobs {
        let job = noop(n)?;
        tick.tick().await;
        sent.push(Instant::now());
        backend.enqueue(job).await?;
    }
    // Polling can take up to its interval for the last job.
    let _ = tokio::time::timeout(Duration::from_secs(10), all_started.notified()).await;
    worker.shutdown().await;

    let started = std::mem::take(&mut *started.lock().unwrap_or_else(|p| p.into_inner()));
    let mut ms: Vec<f64> =
        started.iter().map(|(n, at)| at.saturating_duration_since(sent[*n as usize]).as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    ctx.discard(backend).await?;
    Ok(Latency::of(&ms, sent.len()))
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

// ---------------------------------------------------------------------------------------------
// Enqueue throughput

/// Jobs/s enqueued by `ENQUEUE_TASKS` tasks for `ENQUEUE_FOR`, one job per call (`batch` = 1)
/// or `enqueue_batch` of `batch`. No worker runs.
async fn enqueue_rate(ctx: &Ctx, batch: u64) -> BoxResult<f64> {
    let backend = ctx.default_backend().await?;
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + ENQUEUE_FOR;
    let mut tasks = Vec::new();
    for _ in 0..ENQUEUE_TASKS {
        let (backend, next) = (backend.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut created = 0u64;
            while Instant::now() < deadline {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if batch == 1 {
                    created += u64::from(backend.enqueue(noop(first)?).await?.is_created());
                } else {
                    let jobs = (first..first + batch).map(noop).collect::<BoxResult<Vec<_>>>()?;
                    created += backend.enqueue_batch(jobs).await?.iter().filter(|e| e.is_created()).count() as u64;
                }
            }
            BoxResult::Ok(created)
        }));
    }
    let mut created = 0;
    for task in tasks {
        created += task.await??;
    }
    // Until the last call returned, which may be a little past the deadline.
    let elapsed = start.elapsed();
    ctx.discard(backend).await?;
    Ok(created as f64 / elapsed.as_secs_f64())
}
