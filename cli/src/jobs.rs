//! `redrive jobs …`: the live jobs where the backend stores them (PostgreSQL, SQLite): list,
//! show, and cancel a queued or scheduled one. A broker cannot list its messages: it says so,
//! and its counts are shown instead.

use std::time::Duration;

use clap::Subcommand;
use redrive::any::AnyBackend;
use redrive::{
    CancelOutcome, DeadLetter, Error, ErrorKind, IdempotencyKey, JobId, JobQuery, JobState, Jobs, JobsExt, QueueStats,
    Result,
};

use crate::Done;
use crate::output::Output;

#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Jobs matching the filters, oldest first, one page: queued, scheduled, running (and until
    /// when its lease holds), done, failed, cancelled.
    List(JobFilter),
    /// One job: state, attempts, payload, the errors of this run so far, a cancel's audit.
    Show {
        /// The job's id.
        id: String,
    },
    /// Cancels a queued or scheduled job by id, by key, or every one a filter matches (`--yes`).
    /// On SQS, Azure and QStash, by key only: the key is marked in the workers' ledger (the
    /// records database), so its next delivery completes unrun. For a stored job:
    /// it never runs, who and why are kept on it, and its key stays taken (enqueued again, it is
    /// a duplicate of the cancelled job). A running job is asked to stop: its worker stops the
    /// handler at its next lease renewal and the job ends cancelled, unless it completes first.
    Cancel(CancelArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct JobFilter {
    /// Only this job kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only the job of this idempotency key.
    #[arg(long)]
    key: Option<String>,
    /// Only jobs in this state: queued, scheduled, running, done, failed, cancelled.
    #[arg(long)]
    state: Option<String>,
    /// Only jobs enqueued longer ago than this (`2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Only jobs enqueued less long ago than this.
    #[arg(long, value_parser = humantime::parse_duration)]
    younger_than: Option<Duration>,
    /// The page after this job id (the last id of the previous page).
    #[arg(long)]
    after: Option<String>,
    /// Jobs per page.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

impl JobFilter {
    fn query(&self) -> Result<JobQuery> {
        Ok(JobQuery {
            kind: self.kind.clone(),
            key: self.key.clone().map(IdempotencyKey::parse).transpose()?,
            state: self.state.as_deref().map(str::parse).transpose()?,
            older_than: self.older_than,
            younger_than: self.younger_than,
            after: self.after.clone().map(JobId),
            limit: self.limit.max(1),
        })
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct CancelArgs {
    /// The job to cancel; or `--key`, or a filter.
    #[arg(conflicts_with_all = ["key", "kind", "state", "older_than", "younger_than"])]
    id: Option<String>,
    /// The job of this idempotency key.
    #[arg(long, conflicts_with_all = ["kind", "state", "older_than", "younger_than"])]
    key: Option<String>,
    /// Every queued, scheduled or running job of this kind (with `--yes`; running ones are asked
    /// to stop).
    #[arg(long)]
    kind: Option<String>,
    /// Only queued, only scheduled or only running jobs (with a filter).
    #[arg(long)]
    state: Option<String>,
    /// Only jobs enqueued longer ago than this (with a filter).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Only jobs enqueued less long ago than this (with a filter).
    #[arg(long, value_parser = humantime::parse_duration)]
    younger_than: Option<Duration>,
    /// Why (kept on the job; required, not blank).
    #[arg(long)]
    reason: String,
    /// Who (kept on the job).
    #[arg(long)]
    by: String,
    /// Cancel every job the filter matches; without it, they are listed and none is cancelled.
    #[arg(long)]
    yes: bool,
}

pub(crate) async fn run(target: &AnyBackend, out: &Output, command: &JobsCommand) -> Result<Done> {
    match command {
        JobsCommand::List(filter) => {
            let jobs = match target.list_jobs(&filter.query()?).await {
                Err(e) if e.kind() == ErrorKind::Unsupported => return counts_instead(target, out, e).await,
                jobs => jobs?,
            };
            out.jobs(&jobs);
            Ok(if jobs.is_empty() { Done::NothingMatched } else { Done::Done })
        }
        JobsCommand::Show { id } => {
            let job = match target.get_job(&JobId(id.clone())).await {
                Err(e) if e.kind() == ErrorKind::Unsupported => return counts_instead(target, out, e).await,
                job => job?,
            };
            out.job(&job);
            Ok(Done::Done)
        }
        JobsCommand::Cancel(args) => cancel(target, out, args).await,
    }
}

/// A broker's answer: the counts it has, then the refusal (exit code 1).
async fn counts_instead(target: &AnyBackend, out: &Output, refused: Error) -> Result<Done> {
    out.stats(target.counts().await?, target.count_open().await?);
    Err(refused)
}

async fn cancel(target: &AnyBackend, out: &Output, args: &CancelArgs) -> Result<Done> {
    redrive::kit::require_cancel_audit(&args.reason, &args.by)?;
    if let Some(id) = &args.id {
        let id = JobId(id.clone());
        let outcome = target.cancel_job(&id, &args.reason, &args.by).await?;
        out.cancelled(&id, &outcome);
        return Ok(Done::Done);
    }
    if let Some(key) = &args.key {
        let key = IdempotencyKey::parse(key.clone())?;
        match target.cancel_key(&key, &args.reason, &args.by).await? {
            (Some(id), outcome) => out.cancelled(&id, &outcome),
            // A broker's: marked in its ledger.
            (None, outcome) => out.key_cancelled(&key, &outcome),
        }
        return Ok(Done::Done);
    }
    if args.kind.is_none() && args.state.is_none() && args.older_than.is_none() && args.younger_than.is_none() {
        // A forgotten id or filter must not cancel every job.
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "no job id, no key and no filter: give an id, --key, or a filter (--kind, --state, --older-than, \
             --younger-than) with --yes",
        ));
    }
    let query = JobQuery {
        kind: args.kind.clone(),
        state: args.state.as_deref().map(str::parse).transpose()?,
        older_than: args.older_than,
        younger_than: args.younger_than,
        limit: 500,
        ..JobQuery::default()
    };
    if let Some(state) = query.state.filter(|s| !s.is_cancellable()) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("only queued, scheduled or running jobs can be cancelled, not {state} ones"),
        ));
    }
    if !args.yes {
        let mut matching = Vec::new();
        let mut page_query = query.clone();
        loop {
            let page = target.list_jobs(&page_query).await?;
            let full = page.len() == page_query.page_size();
            page_query.after = page.last().map(|j| j.id.clone());
            matching.extend(page.into_iter().filter(|j| j.state.is_cancellable()));
            if !full {
                break;
            }
        }
        if matching.is_empty() {
            out.count("jobs cancelled", 0);
            return Ok(Done::NothingMatched);
        }
        out.jobs(&matching);
        eprintln!("redrive: nothing cancelled; add --yes to cancel these {} jobs", matching.len());
        return Ok(Done::Done);
    }
    let cancelled = target.cancel_matching(&query, &args.reason, &args.by).await?;
    out.count("jobs cancelled", cancelled.len() as u64);
    Ok(if cancelled.is_empty() { Done::NothingMatched } else { Done::Done })
}

/// The state column of a job: `cancelled by ana` where there is more to say.
pub(crate) fn state_text(job: &redrive::LiveJob) -> String {
    match (&job.state, &job.cancelled, &job.running) {
        (JobState::Cancelled, Some(c), _) => format!("cancelled by {}", c.actor),
        (JobState::Running, Some(c), _) => format!("running, cancel asked by {}", c.actor),
        (JobState::Running, _, Some(r)) => format!("running, lease until {}", r.lease_until.format("%H:%M:%S")),
        (state, ..) => state.to_string(),
    }
}

/// What a broker's cancel by key did: a mark in its workers' ledger.
pub(crate) fn key_outcome_text(key: &IdempotencyKey, outcome: &CancelOutcome) -> String {
    match outcome {
        CancelOutcome::AlreadyCancelled(c) => format!(
            "key {key} was cancelled already, {} by {}: {}; nothing changed",
            c.at.format("%Y-%m-%d %H:%M"),
            c.actor,
            c.reason
        ),
        _ => format!(
            "key {key} cancelled in the workers' ledger: its next delivery completes unrun, a run of it now is \
             stopped at its next renewal, and the key stays taken"
        ),
    }
}

pub(crate) fn outcome_text(id: &JobId, outcome: &CancelOutcome) -> String {
    match outcome {
        CancelOutcome::Cancelled => format!("job {id} cancelled: it will not run, and its key stays taken"),
        CancelOutcome::Requested => format!(
            "job {id} is running: its worker is asked to stop it at its next lease renewal; it ends cancelled \
             unless it completes first (see `redrive jobs show {id}`)"
        ),
        CancelOutcome::AlreadyCancelled(c) => format!(
            "job {id} was cancelled already, {} by {}: {}; nothing changed",
            c.at.format("%Y-%m-%d %H:%M"),
            c.actor,
            c.reason
        ),
    }
}
