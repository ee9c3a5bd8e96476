//! Production conditions: autovacuum on, several worker processes on one queue, a million-job
//! backlog, latency behind a backlog, a worker killed with a full buffer, and a long run with
//! pruning.
//!
//! Worker processes are this benchmark's own binary started again in child mode
//! (`REDRIVE_BENCH_CHILD`), talking to the round over stdin and stdout.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use super::*;

// ---------------------------------------------------------------------------------------------
// Autovacuum

/// Autovacuum turned on server-wide (this machine's PostgreSQL has it off; production's has it
/// on), waking every second. [`restore`](Self::restore) puts the settings back as they were.
pub(crate) struct Autovacuum {
    admin: PgPool,
    /// Each setting, and its earlier value when `ALTER SYSTEM` had set it (else it is reset).
    before: Vec<(&'static str, Option<String>)>,
}

impl Autovacuum {
    pub(crate) async fn on(admin: &PgPool) -> BoxResult<Self> {
        let mut before = Vec::new();
        for (name, value) in [("autovacuum", "on"), ("autovacuum_naptime", "1")] {
            let row = sqlx::query("SELECT setting, sourcefile FROM pg_settings WHERE name = $1")
                .bind(name)
                .fetch_one(admin)
                .await?;
            let from_alter_system =
                row.get::<Option<String>, _>("sourcefile").is_some_and(|f| f.ends_with("postgresql.auto.conf"));
            before.push((name, from_alter_system.then(|| row.get::<String, _>("setting"))));
            sqlx::raw_sql(AssertSqlSafe(format!("ALTER SYSTEM SET {name} = '{value}'"))).execute(admin).await?;
        }
        sqlx::query("SELECT pg_reload_conf()").execute(admin).await?;
        Ok(Self { admin: admin.clone(), before })
    }

    pub(crate) async fn restore(self) -> BoxResult<()> {
        for (name, value) in &self.before {
            let sql = match value {
                Some(value) => format!("ALTER SYSTEM SET {name} = '{value}'"),
                None => format!("ALTER SYSTEM RESET {name}"),
            };
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await?;
        }
        sqlx::query("SELECT pg_reload_conf()").execute(&self.admin).await?;
        Ok(())
    }
}

/// Per-table thresholds low enough that autovacuum really runs during a burn-down of seconds
/// (the defaults wait for a fifth of the table to change).
pub(crate) async fn aggressive_autovacuum(admin: &PgPool, schema: &str) -> BoxResult<()> {
    for table in ["jobs", "job_keys"] {
        let sql = format!(
            "ALTER TABLE \"{schema}\".{table} SET (autovacuum_vacuum_threshold = 1000, \
             autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 1000, \
             autovacuum_analyze_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000, \
             autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_cost_delay = 0)"
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(admin).await?;
    }
    Ok(())
}

/// How many times autovacuum has vacuumed and analyzed `jobs` so far.
pub(crate) async fn autovacuum_runs(admin: &PgPool, schema: &str) -> BoxResult<(i64, i64)> {
    let row = sqlx::query(
        "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(schema)
    .fetch_one(admin)
    .await?;
    Ok((row.get(0), row.get(1)))
}

/// Runs `phase` with autovacuum on, and restores the server's settings whatever it returns.
pub(crate) async fn with_autovacuum<T>(ctx: &Ctx, phase: impl Future<Output = BoxResult<T>>) -> BoxResult<T> {
    let autovacuum = Autovacuum::on(&ctx.admin).await?;
    ctx.aggressive_autovacuum.store(true, Ordering::Relaxed);
    let result = phase.await;
    ctx.aggressive_autovacuum.store(false, Ordering::Relaxed);
    autovacuum.restore().await?;
    result
}

// ---------------------------------------------------------------------------------------------
// Worker processes

/// Child mode: a worker on an existing schema, in a process of its own. Prints `ready`, starts
/// on a `go` line, prints `handled N` as the count grows (at most every 2 ms), and on `stop` (or
/// the end of stdin) shuts down and prints `final N`.
pub(crate) async fn child(spec: &str) -> BoxResult<()> {
    let mut parts = spec.split(' ');
    let (Some(schema), Some(concurrency), Some(handler_ms)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("REDRIVE_BENCH_CHILD should be `schema concurrency handler_ms`, is {spec:?}").into());
    };
    let (concurrency, handler_ms): (usize, u64) = (concurrency.parse()?, handler_ms.parse()?);
    let url = std::env::var("DATABASE_URL")?;
    let backend = PgBackend::connect(PgConfig::new(url).with_schema(schema)).await?;
    let handled = Arc::new(AtomicU64::new(0));
    let handler = {
        let handled = Arc::clone(&handled);
        move |_job: Noop, _ctx: JobContext| {
            let handled = Arc::clone(&handled);
            async move {
                if handler_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(handler_ms)).await;
                }
                handled.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            }
        }
    };
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    out.write_all(b"ready\n").await?;
    out.flush().await?;
    if stdin.next_line().await?.as_deref() != Some("go") {
        return Ok(());
    }
    let config = WorkerConfig { concurrency, ..WorkerConfig::default() };
    let worker = Worker::builder(backend.clone(), backend).config(config).handle::<Noop>(handler).build().start();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    let mut told = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = handled.load(Ordering::Relaxed);
                if now != told {
                    told = now;
                    out.write_all(format!("handled {now}\n").as_bytes()).await?;
                    out.flush().await?;
                }
            }
            _ = stdin.next_line() => break,
        }
    }
    worker.shutdown().await;
    out.write_all(format!("final {}\n", handled.load(Ordering::Relaxed)).as_bytes()).await?;
    out.flush().await?;
    Ok(())
}

/// A worker process started in child mode, and what it has said.
struct ChildWorker {
    process: Child,
    stdin: ChildStdin,
}

/// What the children say: (child, `handled` count so far), or their final count.
enum Said {
    Handled(usize, u64),
    Final(usize, u64),
}

/// Starts `n` worker processes on `schema`, each with `concurrency` handlers taking `handler_ms`,
/// and waits until each is ready. Their lines arrive on the returned channel.
async fn spawn_children(
    ctx: &Ctx,
    schema: &str,
    n: usize,
    concurrency: usize,
    handler_ms: u64,
) -> BoxResult<(Vec<ChildWorker>, mpsc::UnboundedReceiver<Said>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut children = Vec::new();
    for i in 0..n {
        let mut process = Command::new(std::env::current_exe()?)
            .env("REDRIVE_BENCH_CHILD", format!("{schema} {concurrency} {handler_ms}"))
            .env("DATABASE_URL", &ctx.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = process.stdin.take().ok_or("no stdin")?;
        let mut lines = BufReader::new(process.stdout.take().ok_or("no stdout")?).lines();
        if lines.next_line().await?.as_deref() != Some("ready") {
            return Err("a worker process did not start".into());
        }
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let said = match line.split_once(' ') {
                    Some(("handled", n)) => n.parse().map(|n| Said::Handled(i, n)),
                    Some(("final", n)) => n.parse().map(|n| Said::Final(i, n)),
                    _ => continue,
                };
                if let Ok(said) = said {
                    let _ = tx.send(said);
                }
            }
        });
        children.push(ChildWorker { process, stdin });
    }
    Ok((children, rx))
}

async fn tell(children: &mut [ChildWorker], line: &str) -> BoxResult<()> {
    for child in children {
        child.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        child.stdin.flush().await?;
    }
    Ok(())
}

/// A burn-down by `processes` worker processes with `CONCURRENCY` handlers between them.
pub(crate) struct ScaleOut {
    pub(crate) rate: f64,
    /// Handler runs beyond one per job.
    pub(crate) duplicates: i64,
    /// Jobs claimed more than once (handed back or re-claimed).
    pub(crate) reclaimed: i64,
}

pub(crate) async fn scale_out(ctx: &Ctx, processes: usize, jobs: u64) -> BoxResult<ScaleOut> {
    let backend = ctx.default_backend().await?;
    insert_backlog(&backend, jobs).await?;
    analyze(&ctx.admin, backend.schema()).await?;
    checkpoint(&ctx.admin).await?;
    let (mut children, mut said) = spawn_children(ctx, backend.schema(), processes, CONCURRENCY / processes, 0).await?;
    let pids: Vec<String> = children.iter().filter_map(|c| c.process.id()).map(|p| p.to_string()).collect();
    let workers_cpu = || pids.iter().filter_map(|p| process_cpu(p)).sum::<f64>();
    let (workers_before, server_before) = (workers_cpu(), cpu_seconds().map_or(0.0, |(_, s)| s));
    let start = Instant::now();
    tell(&mut children, "go").await?;
    let mut counts = vec![0; processes];
    let deadline = tokio::time::Instant::now() + BURN_TIMEOUT;
    while counts.iter().sum::<u64>() < jobs {
        match tokio::time::timeout_at(deadline, said.recv()).await {
            Ok(Some(Said::Handled(i, n))) => counts[i] = n,
            Ok(Some(Said::Final(..))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let elapsed = start.elapsed();
    let handled_in_time: u64 = counts.iter().sum();
    let per_job = |secs: f64| secs * 1e6 / handled_in_time.max(1) as f64;
    let cpu = format!(
        "CPU per job: workers {:.0} µs, server {:.0} µs",
        per_job(workers_cpu() - workers_before),
        per_job(cpu_seconds().map_or(0.0, |(_, s)| s) - server_before)
    );
    tell(&mut children, "stop").await?;
    let mut finals = vec![None; processes];
    while finals.iter().any(Option::is_none) {
        match tokio::time::timeout(Duration::from_secs(60), said.recv()).await {
            Ok(Some(Said::Final(i, n))) => finals[i] = Some(n),
            Ok(Some(Said::Handled(..))) => {}
            Ok(None) | Err(_) => return Err("a worker process did not shut down".into()),
        }
    }
    for child in &mut children {
        child.process.wait().await?;
    }
    let handled: u64 = finals.iter().flatten().sum();
    let reclaimed: i64 =
        sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM \"{}\".jobs WHERE claims > 1", backend.schema())))
            .fetch_one(&ctx.admin)
            .await?
            .get(0);
    ctx.discard(backend).await?;
    let per_process: Vec<String> = finals.iter().flatten().map(u64::to_string).collect();
    let result = ScaleOut {
        rate: handled_in_time as f64 / elapsed.as_secs_f64(),
        duplicates: handled as i64 - jobs as i64,
        reclaimed,
    };
    println!(
        "- {processes} process(es) × {} handlers: {} in {:.2} s; handled per process [{}]; duplicates {}, re-claimed {}; {cpu}",
        CONCURRENCY / processes,
        rate(result.rate),
        elapsed.as_secs_f64(),
        per_process.join(", "),
        result.duplicates,
        result.reclaimed
    );
    Ok(result)
}

// ---------------------------------------------------------------------------------------------
// A worker killed with a full buffer

pub(crate) struct Killed {
    pub(crate) stranded: usize,
    /// Until every stranded job but those whose handler had started (at most the concurrency)
    /// had run.
    pub(crate) unstarted_back: Duration,
    /// Until every stranded job had run: the started ones wait out their full lease.
    pub(crate) all_back: Duration,
}

/// A worker process with 10 ms handlers claims ahead through a backlog, is SIGKILLed, and a
/// worker in this process takes over: how long until the jobs the dead one held have run.
pub(crate) async fn killed_worker(ctx: &Ctx) -> BoxResult<Killed> {
    let backend = ctx.default_backend().await?;
    insert_backlog(&backend, 5_000).await?;
    analyze(&ctx.admin, backend.schema()).await?;
    checkpoint(&ctx.admin).await?;
    let (mut children, _said) = spawn_children(ctx, backend.schema(), 1, CONCURRENCY, 10).await?;
    tell(&mut children, "go").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut dying = children.pop().ok_or("no worker process")?;
    dying.process.kill().await?; // SIGKILL: nothing is settled or handed back
    let killed_at = Instant::now();
    let stranded: Vec<i64> =
        sqlx::query(AssertSqlSafe(format!("SELECT id FROM \"{}\".jobs WHERE status = 'running'", backend.schema())))
            .fetch_all(&ctx.admin)
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();

    let worker = start_default(&backend, |_job: Noop, _ctx: JobContext| async { Ok::<(), JobError>(()) });
    let left_sql =
        format!("SELECT count(*) FROM \"{}\".jobs WHERE id = ANY($1) AND status <> 'done'", backend.schema());
    let mut unstarted_back = None;
    let all_back = loop {
        let left: i64 =
            sqlx::query(AssertSqlSafe(left_sql.clone())).bind(&stranded).fetch_one(&ctx.admin).await?.get(0);
        if left <= CONCURRENCY as i64 && unstarted_back.is_none() {
            unstarted_back = Some(killed_at.elapsed());
        }
        if left == 0 || killed_at.elapsed() > Duration::from_secs(60) {
            break killed_at.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    worker.shutdown().await;
    ctx.discard(backend).await?;
    let killed = Killed { stranded: stranded.len(), unstarted_back: unstarted_back.unwrap_or(all_back), all_back };
    println!(
        "- {} jobs held by the killed worker; all but the ≤ {CONCURRENCY} whose handlers had started ran within \
         {:.2} s; all within {:.2} s (the started ones keep their {} s lease)",
        killed.stranded,
        killed.unstarted_back.as_secs_f64(),
        killed.all_back.as_secs_f64(),
        WorkerConfig::default().lease.as_secs()
    );
    Ok(killed)
}

// ---------------------------------------------------------------------------------------------
// Latency behind a backlog

/// Enqueue → handler start of single jobs enqueued every 20 ms while a `backlog` drains. Jobs
/// run in order of readiness, so each waits for the backlog ahead of it: this is the queue's
/// wait, as a user sees it.
pub(crate) async fn latency_behind_backlog(ctx: &Ctx, backlog: u64) -> BoxResult<Latency> {
    const PROBES_FROM: u64 = 1 << 40;
    let backend = ctx.default_backend().await?;
    insert_backlog(&backend, backlog).await?;
    analyze(&ctx.admin, backend.schema()).await?;
    checkpoint(&ctx.admin).await?;
    let started = Arc::new(Mutex::new(HashMap::<u64, Instant>::new()));
    let handled = Arc::new(AtomicU64::new(0));
    let handler = {
        let (started, handled) = (Arc::clone(&started), Arc::clone(&handled));
        move |job: Noop, _ctx: JobContext| {
            if job.n >= PROBES_FROM {
                started.lock().unwrap_or_else(|p| p.into_inner()).insert(job.n, Instant::now());
            } else {
                handled.fetch_add(1, Ordering::Relaxed);
            }
            async { Ok::<(), JobError>(()) }
        }
    };
    let worker = start_default(&backend, handler);
    let mut sent = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let deadline = Instant::now() + LARGE_BURN_TIMEOUT;
    while handled.load(Ordering::Relaxed) < backlog && Instant::now() < deadline {
        tick.tick().await;
        let n = PROBES_FROM + sent.len() as u64;
        sent.push(Instant::now());
        backend.enqueue(noop(n)?).await?;
    }
    let all_started = async {
        while started.lock().unwrap_or_else(|p| p.into_inner()).len() < sent.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), all_started).await;
    worker.shutdown().await;
    let started = std::mem::take(&mut *started.lock().unwrap_or_else(|p| p.into_inner()));
    let mut ms: Vec<f64> = started
        .iter()
        .map(|(n, at)| at.saturating_duration_since(sent[(n - PROBES_FROM) as usize]).as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    ctx.discard(backend).await?;
    Ok(Latency::of(&ms, sent.len()))
}

// ---------------------------------------------------------------------------------------------
// A long run through one table

/// `total` jobs through one table while a producer keeps a backlog of about 20k, `prune_done`
/// runs every second and autovacuum is on: throughput per window of 250k jobs, and the sizes of
/// the tables and their indexes as they go.
pub(crate) async fn long_run(ctx: &Ctx, total: u64) -> BoxResult<Vec<f64>> {
    const WINDOW: u64 = 250_000;
    const AHEAD: u64 = 20_000;
    let backend = ctx.default_backend().await?;
    let handled = Arc::new(AtomicU64::new(0));
    let handler = {
        let handled = Arc::clone(&handled);
        move |_job: Noop, _ctx: JobContext| {
            handled.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), JobError>(()) }
        }
    };
    let producer = {
        let (backend, handled) = (backend.clone(), Arc::clone(&handled));
        tokio::spawn(async move {
            for first in (0..total).step_by(INSERT_CHUNK as usize) {
                while first > handled.load(Ordering::Relaxed) + AHEAD {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let chunk = (first..total.min(first + INSERT_CHUNK)).map(noop).collect::<BoxResult<Vec<_>>>()?;
                backend.enqueue_batch(chunk).await?;
            }
            BoxResult::Ok(())
        })
    };
    let pruned = Arc::new(AtomicU64::new(0));
    let pruner = {
        let (backend, pruned) = (backend.clone(), Arc::clone(&pruned));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                every.tick().await;
                match backend.prune_done(Duration::from_secs(1)).await {
                    Ok(n) => pruned.fetch_add(n, Ordering::Relaxed),
                    Err(e) => return eprintln!("prune_done failed: {e}"),
                };
            }
        })
    };
    let worker = start_default(&backend, handler);
    let mut rates = Vec::new();
    let (mut window_start, mut window_from) = (Instant::now(), 0);
    let deadline = Instant::now() + Duration::from_secs(600);
    while window_from < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = handled.load(Ordering::Relaxed);
        if now >= (window_from + WINDOW).min(total) {
            let rate_now = (now - window_from) as f64 / window_start.elapsed().as_secs_f64();
            let sizes = table_sizes(&ctx.admin, backend.schema()).await?;
            println!("  - jobs {}k–{}k: {}; {sizes}", window_from / 1000, now / 1000, rate(rate_now));
            rates.push(rate_now);
            (window_start, window_from) = (Instant::now(), now);
        }
    }
    worker.shutdown().await;
    pruner.abort();
    producer.await??;
    let (vacuums, analyzes) = autovacuum_runs(&ctx.admin, backend.schema()).await?;
    println!(
        "  - at the end: {}; pruned {} jobs; autovacuum ran {vacuums} times on jobs, autoanalyze {analyzes}",
        table_sizes(&ctx.admin, backend.schema()).await?,
        pruned.load(Ordering::Relaxed)
    );
    ctx.discard(backend).await?;
    Ok(rates)
}

/// The sizes of `jobs` and `job_keys`, each with its indexes.
async fn table_sizes(admin: &PgPool, schema: &str) -> BoxResult<String> {
    let rows = sqlx::query(
        "SELECT c.relname, pg_relation_size(c.oid) AS heap, \
                coalesce(json_object_agg(i.relname, pg_relation_size(i.oid)) FILTER (WHERE i.oid IS NOT NULL), '{}') AS indexes \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN pg_index x ON x.indrelid = c.oid LEFT JOIN pg_class i ON i.oid = x.indexrelid \
         WHERE n.nspname = $1 AND c.relname IN ('jobs', 'job_keys') GROUP BY c.relname, c.oid ORDER BY c.relname",
    )
    .bind(schema)
    .fetch_all(admin)
    .await?;
    let mb = |bytes: i64| format!("{:.1} MB", bytes as f64 / 1e6);
    let dead: i64 = sqlx::query(
        "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(schema)
    .fetch_one(admin)
    .await?
    .get(0);
    let tables: Vec<String> = rows
        .iter()
        .map(|r| {
            let indexes: HashMap<String, i64> =
                serde_json::from_value(r.get::<serde_json::Value, _>("indexes")).unwrap_or_default();
            let mut indexes: Vec<_> = indexes.into_iter().collect();
            indexes.sort();
            let indexes: Vec<String> = indexes.into_iter().map(|(name, size)| format!("{name} {}", mb(size))).collect();
            format!("{} {} ({})", r.get::<String, _>("relname"), mb(r.get("heap")), indexes.join(", "))
        })
        .collect();
    Ok(format!("{}; dead rows in jobs {dead}", tables.join("; ")))
}
