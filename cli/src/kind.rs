//! `redrive kind …`: flow control where every worker of the queue sees it, the queue's database
//! (a broker's records database): pause and resume a kind, set its limits, read the history.

use clap::Subcommand;
use redrive::any::AnyBackend;
use redrive::{Error, ErrorKind, Flow, KindFlow, Limits, Rate, Result};

use crate::Done;
use crate::output::Output;

#[derive(Debug, Subcommand)]
pub(crate) enum Kind {
    /// Every paused kind (who, why, since, and a breaker's next probe) and every kind's limits.
    List,
    /// Pauses a kind: workers leave its jobs on the queue, at no attempt's cost and with no
    /// failure record, until it is resumed. A kind paused already stays paused as it was.
    Pause {
        /// The job kind.
        kind: String,
        /// Why (shown with the pause and kept in the history; required, not blank).
        #[arg(long)]
        reason: String,
        /// Who (shown with the pause and kept in the history).
        #[arg(long)]
        by: String,
    },
    /// Resumes a paused kind (a person's pause or a circuit breaker's). A kind that is not paused
    /// is left as it is.
    Resume {
        /// The job kind.
        kind: String,
        /// Who (kept in the history).
        #[arg(long)]
        by: String,
    },
    /// Sets a kind's limits, across every worker: those given change, the others stay; `none`
    /// removes one, `--clear` all.
    Limit(LimitArgs),
    /// Pauses, resumes and limits, newest first, with who and why.
    History {
        /// Only this job kind.
        kind: Option<String>,
        /// Events at most.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct LimitArgs {
    /// The job kind.
    kind: String,
    /// At most this many of the kind's jobs running at once (`none`: no limit).
    #[arg(long)]
    concurrency: Option<String>,
    /// At most this many started per period: `100/1s`, `5/250ms`, `600/1m` (`none`: no limit).
    #[arg(long)]
    rate: Option<String>,
    /// At most this many running at once per value of the job's limit key, a tenant or an
    /// account (`none`: no limit).
    #[arg(long)]
    key_concurrency: Option<String>,
    /// At most this many started per period per value of the job's limit key (`none`: no limit).
    #[arg(long)]
    key_rate: Option<String>,
    /// Removes every limit of the kind.
    #[arg(long, conflicts_with_all = ["concurrency", "rate", "key_concurrency", "key_rate"])]
    clear: bool,
    /// Who (kept in the history).
    #[arg(long)]
    by: String,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, message)
}

/// Refuses a blank `--reason` or `--by` before anything is sent, naming the option.
fn required(option: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Err(invalid(format!("{option} is required and must not be blank: it is kept in the history")));
    }
    Ok(())
}

/// `Some(None)` for `none`, `Some(Some(n))` for a count; `None` when the option was not given.
fn count(option: &str, text: Option<&str>) -> Result<Option<Option<u32>>> {
    let Some(text) = text.map(str::trim) else { return Ok(None) };
    if text == "none" {
        return Ok(Some(None));
    }
    let n = text.parse().map_err(|_| invalid(format!("{option} {text:?}: expected a whole number, or none")))?;
    Ok(Some(Some(n)))
}

/// As [`count`], for a rate read by [`Rate::parse`].
fn rate(option: &str, text: Option<&str>) -> Result<Option<Option<Rate>>> {
    match text.map(str::trim) {
        None => Ok(None),
        Some("none") => Ok(Some(None)),
        Some(text) => {
            Rate::parse(text).map(|r| Some(Some(r))).map_err(|e| invalid(format!("{option}: {}", e.message())))
        }
    }
}

impl LimitArgs {
    /// The limits to set, from those the kind has now: every option read and checked first, so
    /// that a bad one changes nothing.
    fn limits(&self, now: Limits) -> Result<Limits> {
        if self.clear {
            return Ok(Limits::default());
        }
        let concurrency = count("--concurrency", self.concurrency.as_deref())?;
        let rate_given = rate("--rate", self.rate.as_deref())?;
        let key_concurrency = count("--key-concurrency", self.key_concurrency.as_deref())?;
        let key_rate = rate("--key-rate", self.key_rate.as_deref())?;
        if (concurrency, rate_given, key_concurrency, key_rate) == (None, None, None, None) {
            return Err(invalid("give a limit (--concurrency, --rate, --key-concurrency, --key-rate) or --clear"));
        }
        let limits = Limits {
            concurrency: concurrency.unwrap_or(now.concurrency),
            rate: rate_given.unwrap_or(now.rate),
            key_concurrency: key_concurrency.unwrap_or(now.key_concurrency),
            key_rate: key_rate.unwrap_or(now.key_rate),
        };
        limits.validate()?;
        Ok(limits)
    }
}

/// The kind's settings as the store has them (a kind it does not know: running, no limits).
async fn kind_flow(store: &AnyBackend, kind: &str) -> Result<KindFlow> {
    let found = store.kinds().await?.into_iter().find(|k| k.kind == kind);
    Ok(found.unwrap_or_else(|| KindFlow { kind: kind.to_owned(), paused: None, limits: Limits::default() }))
}

pub(crate) async fn run(store: &AnyBackend, out: &Output, command: &Kind) -> Result<Done> {
    match command {
        Kind::List => {
            let kinds = store.kinds().await?;
            out.kinds(&kinds);
            Ok(if kinds.is_empty() { Done::NothingMatched } else { Done::Done })
        }
        Kind::Pause { kind, reason, by } => {
            redrive::kit::check_kind(kind)?;
            required("--reason", reason)?;
            required("--by", by)?;
            let paused = store.pause(kind.trim(), reason.trim(), by.trim(), None).await?;
            out.paused(&kind_flow(store, kind.trim()).await?, paused);
            Ok(Done::Done)
        }
        Kind::Resume { kind, by } => {
            redrive::kit::check_kind(kind)?;
            required("--by", by)?;
            let resumed = store.resume(kind.trim(), by.trim()).await?;
            out.resumed(kind.trim(), resumed);
            Ok(Done::Done)
        }
        Kind::Limit(args) => {
            let kind = args.kind.trim();
            redrive::kit::check_kind(kind)?;
            required("--by", &args.by)?;
            // Read, then set: two operators limiting one kind at once, the later one's view wins.
            let before = kind_flow(store, kind).await?.limits;
            let limits = args.limits(before)?;
            store.set_limits(kind, &limits, args.by.trim()).await?;
            out.limits(kind, &before, &limits);
            Ok(Done::Done)
        }
        Kind::History { kind, limit } => {
            let events = store.events(kind.as_deref().map(str::trim), (*limit).max(1)).await?;
            out.events(&events);
            Ok(if events.is_empty() { Done::NothingMatched } else { Done::Done })
        }
    }
}
