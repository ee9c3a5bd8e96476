//! `redrive`: the operator's command for failure records, on every backend.
//!
//! ```text
//! redrive --backend postgres://localhost/app failed list --kind charge_order
//! redrive --backend sqs://orders failed show <ID>          # records in DATABASE_URL
//! redrive --backend sqlite://app.db queue stats
//! redrive failed blocked                                   # order keys held by a record
//! redrive --backend azure://orders replay --kind ship --older-than 1h --rate 5 --by ada
//! redrive replay <ID> --by ada --reason "fixed in 1.4.2"
//! redrive replay --all --by ada --reason "the carrier is back"
//! redrive discard <ID> --reason "refunded by hand" --by ada
//! redrive failed list --error "mailbox full"
//! redrive discard --error "mailbox full" --reason "the addresses are gone" --by ada --yes
//! redrive kind pause charge_order --reason "the provider is down" --by ada
//! redrive kind limit charge_order --concurrency 5 --rate 100/1s --by ada
//! redrive kind list
//! redrive kind resume charge_order --by ada
//! redrive jobs list --state scheduled --kind charge_order
//! redrive jobs show <JOB ID>
//! redrive jobs cancel <JOB ID> --reason "the order was withdrawn" --by ada
//! redrive jobs cancel --kind send_digest --state scheduled --reason "digest retired" --by ada --yes
//! redrive doctor
//! redrive verify --evidence evidence/ --key-format send_receipt=order
//! redrive verify --check-fresh evidence/ --max-age 7d --key-format send_receipt=order
//! ```
//!
//! Exit codes: 0 done, 1 error (a broker asked for its jobs: its counts are printed, then the
//! refusal), 2 nothing matched (no record or job with that id, an empty list, a bulk replay,
//! discard or cancel that found nothing, no order key blocked, no kind paused or limited, no flow
//! history).

mod backends;
mod doctor;
mod evidence;
mod jobs;
mod kind;
mod output;
mod verify;
#[cfg(any(feature = "qstash", feature = "inngest"))]
mod verify_push;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use redrive::any::AnyBackend;
use redrive::{DeadLetter, ErrorKind, FailureId, FailureQuery, QueueStats, Replay, ReplayOutcome, Severity};

/// Read, replay, discard and purge failure records on any redrive backend; pause, resume and
/// limit job kinds; list and cancel live jobs.
#[derive(Debug, Parser)]
#[command(name = "redrive", version, about)]
struct Cli {
    /// The queue: `postgres://…` (its records are in the same database), `sqlite://PATH` (the
    /// file), `sqs://QUEUE` (AWS from
    /// the environment as usual; `REDRIVE_SQS_ENDPOINT` for moto), `azure://QUEUE`
    /// (`AZURE_STORAGE_CONNECTION_STRING`), or `qstash://HOST/PATH`, the workers' receiver
    /// (`QSTASH_TOKEN`, and `QSTASH_URL` for another API; `qstash+http://` for the emulator).
    #[arg(long, env = "REDRIVE_URL", global = true, hide_env_values = true)]
    backend: Option<String>,
    /// Where an SQS, Azure or QStash queue keeps its failure records and its flow control (paused
    /// kinds, limits): a PostgreSQL URL (default `DATABASE_URL`).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    records: Option<String>,
    /// The PostgreSQL schema of redrive's tables.
    #[arg(long, env = "REDRIVE_PG_SCHEMA", default_value = "redrive", global = true)]
    schema: String,
    /// JSON on stdout instead of tables, for scripts.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Failure records: list, show, count.
    Failed {
        #[command(subcommand)]
        command: Failed,
    },
    /// Replays one record by id, every open record matching a filter, or every open record
    /// (`--all`), with its original keys; each record keeps who replayed it and why.
    Replay(ReplayArgs),
    /// Closes an open record without replaying it: one by id, every open record matching a
    /// filter, or every open record (`--all`). In bulk, `--dry-run` lists what would be closed
    /// and `--yes` closes it; each record keeps who discarded it and why.
    Discard(DiscardArgs),
    /// Deletes records (open or closed) whose last failure is older than the age, payloads
    /// included, and frees their keys.
    Purge {
        /// An age: `30d`, `12h`, `90min`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
    /// Serves the dashboard: open records by kind and severity, a record's payload and errors,
    /// replay and discard, bulk replay, the audit trail, queue depth, paused kinds and limits
    /// (pause, resume, limit), charts of the last day, and Prometheus `/metrics`.
    Serve {
        /// The address to listen on. Beyond loopback a token is required.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: std::net::SocketAddr,
        /// The operators' sign-in token, also the bearer token of `/metrics` (at least 16
        /// characters; required beyond loopback).
        #[arg(long, env = "REDRIVE_DASHBOARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The URL operators open; `https://…` (TLS at a proxy in front) makes its cookies Secure.
        #[arg(long, env = "REDRIVE_DASHBOARD_URL")]
        public_url: Option<String>,
        /// Trust the proxy in front to set `X-Forwarded-Proto` on every request (https: Secure
        /// cookies).
        #[arg(long)]
        trust_forwarded_proto: bool,
        /// How often the Charts page samples the queue's depth (kept 24 hours in memory).
        #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
        sample_every: Duration,
    },
    /// The queue's counts.
    Queue {
        #[command(subcommand)]
        command: Queue,
    },
    /// Flow control, as every worker of the queue sees it: pause and resume a job kind, set its
    /// limits, read who did what. Kept in the queue's database (a broker's: its records database,
    /// where its workers' ledger normally is).
    Kind {
        #[command(subcommand)]
        command: kind::Kind,
    },
    /// The live jobs where the backend stores them (PostgreSQL, SQLite): list, show, cancel. A
    /// broker (SQS, Azure, QStash) cannot list its messages: its counts are shown instead.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// The four tests of safe retries (replay, race, exhaust, recover) on this backend, with a
    /// job kind of its own (`redrive_verify`) that the application's workers put back untouched;
    /// writes dated evidence (JSON and Markdown). `--check-fresh DIR` checks that evidence
    /// instead: passed, recent, and of this backend, configuration and key formats.
    Verify(verify::VerifyArgs),
    /// The configuration rules of this backend (docs/VERIFY.md has them all): a database's
    /// migrations, unique keys, vacuum and alerted records; a broker's queue settings (SQS's
    /// visibility, redrive policy and alarm, Azure's poison queue and time to live, QStash's
    /// retries, keys and destination, pgmq's queue) with its records database beside them.
    /// Each with pass, warn or fail, what was found and the fix; exit 1 when a rule fails.
    Doctor(doctor::DoctorArgs),
}

#[derive(Debug, Subcommand)]
enum Failed {
    /// Records matching the filters, oldest first, one page.
    List(Filter),
    /// One record: payload, error history, attempts, keys.
    Show {
        /// The record's id.
        id: String,
    },
    /// How many records are open.
    Count,
    /// The order keys an open record holds back (`Job::order_key`): the later jobs of each wait
    /// until the record is replayed or discarded.
    Blocked,
}

#[derive(Debug, Subcommand)]
enum Queue {
    /// Queued and running jobs, and open records.
    Stats,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum State {
    Open,
    Closed,
    All,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Level {
    Warning,
    Error,
    Critical,
}

impl Level {
    fn severity(self) -> Severity {
        match self {
            Self::Warning => Severity::Warning,
            Self::Error => Severity::Error,
            Self::Critical => Severity::Critical,
        }
    }
}

#[derive(Debug, clap::Args)]
struct Filter {
    /// Only this job kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only this severity.
    #[arg(long, value_enum)]
    severity: Option<Level>,
    /// Open, closed (replayed or discarded), or all.
    #[arg(long, value_enum, default_value = "open")]
    state: State,
    /// Only records whose last failure is older than this (`2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Only records whose last error holds this text (letters without case; `%` and `_` as
    /// themselves).
    #[arg(long)]
    error: Option<String>,
    /// The page after this record id (the last id of the previous page).
    #[arg(long)]
    after: Option<String>,
    /// Records per page.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

impl Filter {
    fn query(&self) -> FailureQuery {
        let open = match self.state {
            State::Open => Some(true),
            State::Closed => Some(false),
            State::All => None,
        };
        FailureQuery {
            kind: self.kind.clone(),
            open,
            failed_before: self.older_than.map(ago),
            error_contains: self.error.clone(),
            after: self.after.clone().map(FailureId),
            limit: self.limit.max(1),
            ..FailureQuery::default()
        }
    }
}

/// Which open records a bulk replay or discard takes.
#[derive(Debug, clap::Args)]
struct Bulk {
    /// Every open record, of any kind: a bulk replay or discard without a filter must say so.
    #[arg(long, conflicts_with_all = ["id", "kind", "severity", "older_than", "error"])]
    all: bool,
    /// Only this job kind (bulk).
    #[arg(long, conflicts_with = "id")]
    kind: Option<String>,
    /// Only this severity (bulk).
    #[arg(long, value_enum, conflicts_with = "id")]
    severity: Option<Level>,
    /// Only records whose last failure is older than this (bulk).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "id")]
    older_than: Option<Duration>,
    /// Only records whose last error holds this text (bulk).
    #[arg(long, conflicts_with = "id")]
    error: Option<String>,
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The record to replay; without it, every open record matching the filters (or `--all`).
    id: Option<String>,
    #[command(flatten)]
    bulk: Bulk,
    /// Who replays (kept with each record).
    #[arg(long, required_unless_present = "dry_run")]
    by: Option<String>,
    /// Why (kept with each record; may be left out).
    #[arg(long, default_value = "", hide_default_value = true)]
    reason: String,
    /// Replays a second at most (bulk).
    #[arg(long, default_value_t = 10)]
    rate: u32,
    /// Lists what would be replayed, replays nothing.
    #[arg(long)]
    dry_run: bool,
    /// Replays one record with its payload corrected under the same keys, while its effect has
    /// not happened: a JSON merge patch (RFC 7386, an object) or a JSON patch (RFC 6902, an
    /// array of operations), inline or `@FILE`. `--reason` is then required; the record keeps
    /// the original payload and the amended one.
    #[arg(long, value_name = "PATCH", requires = "id")]
    amend: Option<String>,
}

/// The record's `payload` with `patch` applied: inline JSON or `@FILE`, an object as a merge
/// patch, an array as a JSON patch. A patch that does not read or apply is refused, naming why
/// (never the payload's values).
fn amend(payload: &serde_json::Value, patch: &str) -> redrive::Result<serde_json::Value> {
    let invalid = |why: String| redrive::Error::new(ErrorKind::InvalidInput, format!("--amend: {why}"));
    let text = match patch.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read {path}: {e}")))?,
        None => patch.to_owned(),
    };
    let patch: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("the patch is not JSON: {e}")))?;
    let mut amended = payload.clone();
    match &patch {
        serde_json::Value::Object(_) => json_patch::merge(&mut amended, &patch),
        serde_json::Value::Array(_) => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch).map_err(|e| invalid(format!("not a JSON patch (RFC 6902): {e}")))?;
            json_patch::patch(&mut amended, &ops)
                .map_err(|e| invalid(format!("the JSON patch does not apply: {e}")))?;
        }
        _ => return Err(invalid("give a merge patch (an object) or a JSON patch (an array of operations)".into())),
    }
    if amended == *payload {
        return Err(invalid("the patch changes nothing; replay without --amend".into()));
    }
    Ok(amended)
}

#[derive(Debug, clap::Args)]
struct DiscardArgs {
    /// The record to discard; without it, every open record matching the filters (or `--all`).
    id: Option<String>,
    #[command(flatten)]
    bulk: Bulk,
    /// Why (kept with each record; required, not blank).
    #[arg(long, required_unless_present = "dry_run")]
    reason: Option<String>,
    /// Who discards (kept with each record).
    #[arg(long, required_unless_present = "dry_run")]
    by: Option<String>,
    /// Discards what matched (bulk): without it, nothing is closed.
    #[arg(long, conflicts_with_all = ["id", "dry_run"])]
    yes: bool,
    /// Lists what would be discarded, discards nothing.
    #[arg(long)]
    dry_run: bool,
}

fn ago(age: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX)
}

/// What a command ends with: done, or nothing matched (exit code 2).
pub(crate) enum Done {
    Done,
    NothingMatched,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(Done::Done) => ExitCode::SUCCESS,
        Ok(Done::NothingMatched) => ExitCode::from(2),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            eprintln!("redrive: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("redrive: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: &Cli) -> redrive::Result<Done> {
    if let Command::Doctor(args) = &cli.command {
        // Not connected: connecting refuses or changes what the rules report.
        return doctor::run(&backends::options(cli)?, &output::Output { json: cli.json }, args).await;
    }
    let target = backends::connect(cli).await?;
    if let Command::Serve { bind, token, public_url, trust_forwarded_proto, sample_every } = &cli.command {
        serve(target, *bind, token.clone(), public_url.as_deref(), *trust_forwarded_proto, *sample_every).await?;
        return Ok(Done::Done);
    }
    let out = output::Output { json: cli.json };
    match &cli.command {
        Command::Failed { command: Failed::List(filter) } => {
            let records = backends::list_of(&target, &filter.query(), filter.severity.map(Level::severity)).await?;
            out.records(&records);
            Ok(if records.is_empty() { Done::NothingMatched } else { Done::Done })
        }
        Command::Failed { command: Failed::Show { id } } => {
            out.record(&target.get(&FailureId(id.clone())).await?);
            Ok(Done::Done)
        }
        Command::Failed { command: Failed::Count } => {
            out.count("open records", target.count_open().await?);
            Ok(Done::Done)
        }
        Command::Failed { command: Failed::Blocked } => {
            let blocked = target.blocked().await?;
            out.blocked(&blocked);
            Ok(if blocked.is_empty() { Done::NothingMatched } else { Done::Done })
        }
        Command::Replay(args) => replay(&target, &out, args).await,
        Command::Discard(args) => discard(&target, &out, args).await,
        Command::Purge { older_than } => {
            out.count("records purged", target.purge(*older_than).await?);
            Ok(Done::Done)
        }
        Command::Serve { .. } => unreachable!("served above"),
        Command::Queue { command: Queue::Stats } => {
            out.stats(target.counts().await?, target.count_open().await?);
            Ok(Done::Done)
        }
        Command::Kind { command } => kind::run(&target, &out, command).await,
        Command::Jobs { command } => jobs::run(&target, &out, command).await,
        Command::Doctor(_) => unreachable!("checked above"),
        Command::Verify(args) => {
            // Its workers' warnings (a refused settlement, a store that failed) go to stderr;
            // `RUST_LOG` for more.
            let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
            verify::run(cli.backend.as_deref().unwrap_or_default(), &target, &out, args).await
        }
    }
}

/// The dashboard until SIGTERM or SIGINT, its requests logged to stderr (`RUST_LOG` to change).
async fn serve(
    target: AnyBackend,
    bind: std::net::SocketAddr,
    token: Option<String>,
    public_url: Option<&str>,
    trust_forwarded_proto: bool,
    sample_every: Duration,
) -> redrive::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| redrive::Error::new(ErrorKind::Config, "cannot record metrics").with_source(e))?;
    // The backend is its own flow store (a broker's: its records database): the Kinds page.
    let mut dashboard = redrive_dashboard::Dashboard::new(target.clone())
        .with_flow(target)
        .with_metrics(metrics)
        .with_sample_every(sample_every)?;
    if let Some(token) = token {
        dashboard = dashboard.with_token(token)?;
    }
    if let Some(url) = public_url {
        dashboard = dashboard.with_public_url(url)?;
    }
    if trust_forwarded_proto {
        dashboard = dashboard.trust_forwarded_proto();
    }
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| redrive::Error::new(ErrorKind::Config, format!("cannot listen on {bind}")).with_source(e))?;
    eprintln!("redrive: the dashboard is on http://{}", listener.local_addr().unwrap_or(bind));
    dashboard.serve(listener, redrive::stop_signal()).await
}

async fn replay(target: &AnyBackend, out: &output::Output, args: &ReplayArgs) -> redrive::Result<Done> {
    let by = args.by.as_deref().unwrap_or_default();
    if let Some(id) = &args.id {
        let id = FailureId(id.clone());
        let outcome = match &args.amend {
            Some(patch) => {
                let record = target.get(&id).await?;
                let amended = amend(&record.payload, patch)?;
                if args.dry_run {
                    out.amended(&id, &amended);
                    return Ok(Done::Done);
                }
                target.replay_amended(&id, &amended, &args.reason, by).await?
            }
            None => target.replay(&id, &args.reason, by).await?,
        };
        out.outcome(&id.0, &outcome);
        return Ok(Done::Done);
    }
    let filter = bulk_filter(&args.bulk, "replay")?;
    if !args.dry_run {
        redrive::kit::require_audit("a replay's actor (--by)", by)?;
    }
    let matching = every_page(target, &filter).await?;
    if matching.is_empty() {
        out.count("records replayed", 0);
        return Ok(Done::NothingMatched);
    }
    if args.dry_run {
        out.records(&matching);
        return Ok(Done::Done);
    }
    // Interrupted, the command can be run again: replayed records are closed and not matched.
    let gap = Duration::from_secs(1) / args.rate.max(1);
    let mut pace = tokio::time::interval(gap);
    let (mut replayed, mut closed) = (0u64, 0u64);
    // On stderr, and only on a terminal (indicatif hides it otherwise): stdout stays the summary.
    let progress = if out.json { ProgressBar::hidden() } else { ProgressBar::new(matching.len() as u64) };
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} replayed, {per_sec}, {eta} left").expect("a valid template"),
    );
    for record in &matching {
        pace.tick().await;
        match target.replay(&record.id, &args.reason, by).await {
            Ok(ReplayOutcome::Replayed(_)) => replayed += 1,
            Ok(ReplayOutcome::AlreadyClosed(_)) => closed += 1,
            Err(e) => {
                progress.abandon();
                eprintln!("redrive: stopped after {replayed} replayed; run the same command again to go on");
                return Err(e);
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    out.bulk(replayed, closed);
    Ok(Done::Done)
}

/// Every open record `filter` matches, all pages read before anything is closed: a closed record
/// would shift the pages.
/// The open records a bulk replay or discard (`verb`) takes: its filter, or every one with
/// `--all`. A forgotten id or filter must not act on every failure.
fn bulk_filter(bulk: &Bulk, verb: &str) -> redrive::Result<Filter> {
    if !bulk.all && bulk.kind.is_none() && bulk.severity.is_none() && bulk.older_than.is_none() && bulk.error.is_none()
    {
        return Err(redrive::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no record id and no filter: give an id, a filter (--kind, --severity, --older-than, --error), \
                 or --all to {verb} every open record"
            ),
        ));
    }
    Ok(Filter {
        kind: bulk.kind.clone(),
        severity: bulk.severity,
        state: State::Open,
        older_than: bulk.older_than,
        error: bulk.error.clone(),
        after: None,
        limit: 500,
    })
}

async fn every_page(target: &AnyBackend, filter: &Filter) -> redrive::Result<Vec<redrive::FailureRecord>> {
    let severity = filter.severity.map(Level::severity);
    let mut matching = Vec::new();
    let mut query = filter.query();
    loop {
        let page = target.list(&query).await?;
        let full = page.len() == query.limit;
        query.after = page.last().map(|r| r.id.clone());
        matching.extend(page.into_iter().filter(|r| severity.is_none_or(|s| r.severity == s)));
        if !full {
            return Ok(matching);
        }
    }
}

async fn discard(target: &AnyBackend, out: &output::Output, args: &DiscardArgs) -> redrive::Result<Done> {
    let (reason, by) = (args.reason.as_deref().unwrap_or_default(), args.by.as_deref().unwrap_or_default());
    if let Some(id) = &args.id {
        let id = FailureId(id.clone());
        target.discard(&id, reason, by).await?;
        out.record(&target.get(&id).await?);
        return Ok(Done::Done);
    }
    let filter = bulk_filter(&args.bulk, "discard")?;
    if !args.dry_run {
        redrive::kit::require_audit("a discard's reason (--reason)", reason)?;
        redrive::kit::require_audit("a discard's actor (--by)", by)?;
    }
    let matching = every_page(target, &filter).await?;
    if matching.is_empty() {
        out.count("records discarded", 0);
        return Ok(Done::NothingMatched);
    }
    if args.dry_run {
        out.records(&matching);
        return Ok(Done::Done);
    }
    if !args.yes {
        // The work a discard drops is not done again: the person says so, having seen the count.
        return Err(redrive::Error::new(
            ErrorKind::InvalidInput,
            format!("{} open records match: list them with --dry-run, and add --yes to discard them", matching.len()),
        ));
    }
    let (mut discarded, mut closed) = (0u64, 0u64);
    for record in &matching {
        // Closed meanwhile (replayed, or discarded by someone else): left as it is.
        if !target.get(&record.id).await?.state.is_open() {
            closed += 1;
            continue;
        }
        if let Err(e) = target.discard(&record.id, reason, by).await {
            eprintln!("redrive: stopped after {discarded} discarded; run the same command again to go on");
            return Err(e);
        }
        discarded += 1;
    }
    out.discarded(discarded, closed);
    Ok(Done::Done)
}
