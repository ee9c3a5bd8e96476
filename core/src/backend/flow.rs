//! [`Flow`]: flow control kept where every worker of a queue sees it — paused kinds, a kind's
//! limits, the rate limits' buckets and the concurrency limits' slots.
//!
//! The store is the effect ledger's database ([`Ledger::flow`](super::Ledger::flow)): Postgres,
//! SQLite, or memory for one process. What is stored is shared by every worker using that
//! ledger, whatever queue it claims from, so a broker (SQS, Azure, QStash) gets flow control
//! across processes through its ledger.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};

/// A rate: at most `count` in any `per`, spread evenly once the first `count` (the burst) are
/// spent. Kept as a GCRA (a token bucket of `count` refilled at `count / per`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// How many per period; at least 1.
    pub count: u32,
    /// The period; longer than zero.
    pub per: Duration,
}

impl Rate {
    /// `count` a second.
    pub const fn per_second(count: u32) -> Self {
        Self { count, per: Duration::from_secs(1) }
    }

    /// `count` a minute.
    pub const fn per_minute(count: u32) -> Self {
        Self { count, per: Duration::from_secs(60) }
    }

    /// The time between two at the steady rate: `per / count`.
    pub fn interval(&self) -> Duration {
        self.per / self.count.max(1)
    }

    /// Reads `100/1s`, `5/250ms`, `600/1m`: a count, a slash, a period (`ms`, `s`, `m` or `h`).
    pub fn parse(text: &str) -> Result<Self> {
        let invalid =
            || Error::new(ErrorKind::InvalidInput, format!("rate {text:?}: expected COUNT/PERIOD, e.g. 100/1s"));
        let (count, per) = text.trim().split_once('/').ok_or_else(invalid)?;
        let count: u32 = count.trim().parse().map_err(|_| invalid())?;
        let per = per.trim();
        let (digits, unit) = per.split_at(per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len()));
        let n: u64 = if digits.is_empty() { 1 } else { digits.parse().map_err(|_| invalid())? };
        let per = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => return Err(invalid()),
        };
        let rate = Self { count, per };
        rate.validate()?;
        Ok(rate)
    }

    fn validate(&self) -> Result<()> {
        if self.count == 0 || self.per < Duration::from_millis(1) {
            return Err(Error::new(ErrorKind::InvalidInput, "a rate needs a count of 1 or more per 1 ms or more"));
        }
        Ok(())
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.per.as_millis();
        match ms {
            _ if ms.is_multiple_of(3_600_000) => write!(f, "{}/{}h", self.count, ms / 3_600_000),
            _ if ms.is_multiple_of(60_000) => write!(f, "{}/{}m", self.count, ms / 60_000),
            _ if ms.is_multiple_of(1000) => write!(f, "{}/{}s", self.count, ms / 1000),
            _ => write!(f, "{}/{}ms", self.count, ms),
        }
    }
}

/// A kind's limits, shared by every worker of the queue. `None` is no limit; all `None` (the
/// default) is a kind without limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// At most this many jobs of the kind running at once, across every worker.
    pub concurrency: Option<u32>,
    /// At most this many of the kind's jobs started per period, across every worker.
    pub rate: Option<Rate>,
    /// At most this many jobs running at once per value of the job's
    /// [`limit_key`](crate::Job::limit_key) (a tenant, an account); the rest of the kind runs.
    pub key_concurrency: Option<u32>,
    /// At most this many started per period per value of the job's
    /// [`limit_key`](crate::Job::limit_key).
    pub key_rate: Option<Rate>,
}

impl Limits {
    /// Whether no limit is set.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses a limit of 0 running at once or a rate of 0: a kind that should not run is paused.
    pub fn validate(&self) -> Result<()> {
        if self.concurrency == Some(0) || self.key_concurrency == Some(0) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "a concurrency limit of 0 would stop the kind for ever: pause it instead",
            ));
        }
        self.rate.iter().chain(&self.key_rate).try_for_each(Rate::validate)
    }
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = vec![];
        if let Some(n) = self.concurrency {
            parts.push(format!("{n} at once"));
        }
        if let Some(rate) = self.rate {
            parts.push(format!("{rate}"));
        }
        if let Some(n) = self.key_concurrency {
            parts.push(format!("{n} at once per key"));
        }
        if let Some(rate) = self.key_rate {
            parts.push(format!("{rate} per key"));
        }
        if parts.is_empty() { f.write_str("no limits") } else { f.write_str(&parts.join(", ")) }
    }
}

/// Who paused a kind, why and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    /// Why, as given.
    pub reason: String,
    /// Who: a person's name, or [`BREAKER`] for the circuit breaker.
    pub by: String,
    /// Since when.
    pub at: DateTime<Utc>,
    /// Set where the pause is a circuit breaker's: a probe job may run from then on (half-open).
    /// A person's pause has none: it lasts until someone resumes the kind.
    pub probe_at: Option<DateTime<Utc>>,
}

/// Who a circuit breaker's pauses are by.
pub const BREAKER: &str = "breaker";

/// A kind's flow settings: its pause, if paused, and its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindFlow {
    /// The job kind.
    pub kind: String,
    /// Set while the kind is paused.
    pub paused: Option<Paused>,
    /// Its limits.
    pub limits: Limits,
}

/// What a flow event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowAction {
    /// The kind was paused.
    Paused,
    /// The kind was resumed.
    Resumed,
    /// The kind's limits were set (or cleared).
    Limits,
}

impl FlowAction {
    /// The stored name: `paused`, `resumed`, `limits`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::Limits => "limits",
        }
    }

    /// Reads a stored name.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "paused" => Ok(Self::Paused),
            "resumed" => Ok(Self::Resumed),
            "limits" => Ok(Self::Limits),
            other => Err(Error::new(ErrorKind::Backend, format!("unknown flow action {other:?}"))),
        }
    }
}

/// One change to a kind's flow, kept as the audit trail of pauses and limits (as a discard is
/// kept on its record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowEvent {
    /// When.
    pub at: DateTime<Utc>,
    /// The kind.
    pub kind: String,
    /// What was done.
    pub action: FlowAction,
    /// Who did it ([`BREAKER`] for the circuit breaker).
    pub by: String,
    /// Why (a pause's reason), or what (the limits set, as [`Limits`] displays them).
    pub detail: String,
}

/// What [`Flow::take_tokens`] granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// How many of those asked for may start now (0 to the number asked for).
    pub granted: u32,
    /// When none were granted: how long until one is.
    pub wait: Duration,
}

/// One of a concurrency limit's slots, held for a lease: a worker that dies lets it lapse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The limit's key (`kind:charge_order`, `key:charge_order:acct_42`).
    pub key: String,
    /// Which slot, 0 to the limit less one.
    pub slot: u32,
    /// This holder's token; a slot taken over after a lapse no longer matches.
    pub token: String,
}

/// Flow control's shared state. Every method is one atomic step in the store: two workers
/// racing for the last slot, the last token or a breaker's probe get it once between them.
pub trait Flow: Send + Sync {
    /// Every kind that is paused or has limits, by kind.
    fn kinds(&self) -> impl Future<Output = Result<Vec<KindFlow>>> + Send;

    /// Pauses `kind`, keeping why and who (both required, see [`require_history`]). A breaker's
    /// pause (`probe_after` set) lets a probe run `probe_after` from now. Answers false, changing
    /// nothing, if the kind is paused already: the first pause stands, so of several workers
    /// tripping one breaker, one alerts. A person's pause (`probe_after` `None`) takes over a
    /// breaker's, so that no probe resumes a kind a person means to keep paused.
    fn pause(
        &self,
        kind: &str,
        reason: &str,
        by: &str,
        probe_after: Option<Duration>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Resumes `kind`, keeping who. Answers false if it was not paused.
    fn resume(&self, kind: &str, by: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Sets `kind`'s limits ([`Limits::default`] clears them), keeping who.
    fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> impl Future<Output = Result<()>> + Send;

    /// The latest `limit` flow events, newest first; of one kind, or of all.
    fn events(&self, kind: Option<&str>, limit: usize) -> impl Future<Output = Result<Vec<FlowEvent>>> + Send;

    /// Takes the probe of a breaker's pause whose probe time has come, moving the next probe
    /// `cool_down` on. True for one caller per probe time; false if the kind is not paused by a
    /// breaker, its probe is not due, or someone else took it.
    fn take_probe(&self, kind: &str, cool_down: Duration) -> impl Future<Output = Result<bool>> + Send;

    /// Resumes `kind` if a breaker paused it (its probe succeeded); a person's pause stays.
    fn close_breaker(&self, kind: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Takes up to `want` starts from the bucket `key` at `rate`.
    fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> impl Future<Output = Result<Tokens>> + Send;

    /// Takes a free slot of the `limit` of `key` for `lease`, or answers `None` if all are held.
    fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> impl Future<Output = Result<Option<Slot>>> + Send;

    /// Keeps holding `slot` for `lease` from now. False if it lapsed and was taken over.
    fn renew_slot(&self, slot: &Slot, lease: Duration) -> impl Future<Output = Result<bool>> + Send;

    /// Lets go of `slot` (nothing if it lapsed and was taken over).
    fn release_slot(&self, slot: &Slot) -> impl Future<Output = Result<()>> + Send;
}

/// The [`Flow`] of a ledger that has none; it cannot be made.
#[derive(Debug)]
pub enum NoFlow {}

impl Flow for NoFlow {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        match *self {}
    }
    async fn pause(&self, _: &str, _: &str, _: &str, _: Option<Duration>) -> Result<bool> {
        match *self {}
    }
    async fn resume(&self, _: &str, _: &str) -> Result<bool> {
        match *self {}
    }
    async fn set_limits(&self, _: &str, _: &Limits, _: &str) -> Result<()> {
        match *self {}
    }
    async fn events(&self, _: Option<&str>, _: usize) -> Result<Vec<FlowEvent>> {
        match *self {}
    }
    async fn take_probe(&self, _: &str, _: Duration) -> Result<bool> {
        match *self {}
    }
    async fn close_breaker(&self, _: &str) -> Result<bool> {
        match *self {}
    }
    async fn take_tokens(&self, _: &str, _: Rate, _: u32) -> Result<Tokens> {
        match *self {}
    }
    async fn take_slot(&self, _: &str, _: u32, _: Duration) -> Result<Option<Slot>> {
        match *self {}
    }
    async fn renew_slot(&self, _: &Slot, _: Duration) -> Result<bool> {
        match *self {}
    }
    async fn release_slot(&self, _: &Slot) -> Result<()> {
        match *self {}
    }
}

/// The checks every store makes before a pause: a kind, a reason and a name.
pub fn check_pause(kind: &str, reason: &str, by: &str) -> Result<()> {
    check_kind(kind)?;
    require_history("a pause's reason", reason)?;
    require_history("who paused", by)
}

/// Refuses `text` if it is blank: what a kind's history keeps of who changed it (and why, for a
/// pause). `what` names it in the error.
pub fn require_history(what: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{what} is required: it is kept in the kind's history"),
        ));
    }
    Ok(())
}

/// Refuses a blank kind name.
pub fn check_kind(kind: &str) -> Result<()> {
    if kind.trim().is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, "a job kind is required"));
    }
    Ok(())
}

/// A rate as a store keeps it: its count and its period in microseconds (`None`, `None`: none).
pub fn rate_columns(rate: Option<Rate>) -> (Option<i64>, Option<i64>) {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX / 4);
    rate.map_or((None, None), |r| (Some(i64::from(r.count)), Some(micros(r.per))))
}

/// A rate read back from [`rate_columns`]; a value that does not fit is a
/// [`Decode`](ErrorKind::Decode) error.
pub fn stored_rate(count: Option<i64>, per_us: Option<i64>) -> Result<Option<Rate>> {
    let (Some(count), Some(per)) = (count, per_us) else { return Ok(None) };
    let per = u64::try_from(per).map_err(|_| stored("rate"))?;
    Ok(Some(Rate { count: stored_count(count, "rate")?, per: Duration::from_micros(per) }))
}

/// A count (of a rate, or a concurrency limit) read back; a value that does not fit is a
/// [`Decode`](ErrorKind::Decode) error naming `what`.
pub fn stored_count(n: i64, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| stored(what))
}

fn stored(what: &str) -> Error {
    Error::new(ErrorKind::Decode, format!("a stored {what} does not read back"))
}

/// The GCRA step every store computes the same way, in microseconds: with the bucket's
/// theoretical arrival time `tat` (`None`: a new bucket) at `now`, how many of `want` are granted
/// and the bucket's new time, or how long to wait. A grant moves the time one interval per start;
/// a start is allowed while the time stays within one period ahead of now (the burst).
pub fn gcra(tat: Option<i64>, now: i64, rate: Rate, want: u32) -> (Tokens, i64) {
    let interval = (rate.interval().as_micros() as i64).max(1);
    let per = rate.per.as_micros() as i64;
    let from = tat.unwrap_or(now).max(now);
    let room = (now + per - from) / interval;
    let granted = room.clamp(0, i64::from(want)) as u32;
    if granted > 0 {
        let tat = from + interval * i64::from(granted);
        (Tokens { granted, wait: Duration::ZERO }, tat)
    } else {
        let wait = (from + interval - per - now).max(1) as u64;
        (Tokens { granted: 0, wait: Duration::from_micros(wait) }, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_and_print_the_same() {
        for text in ["100/1s", "5/250ms", "600/1m", "1/2h"] {
            assert_eq!(Rate::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Rate::parse("10/s").unwrap(), Rate::per_second(10));
        for bad in ["0/1s", "10", "10/0s", "x/1s", "10/1d"] {
            assert_eq!(Rate::parse(bad).unwrap_err().kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn gcra_grants_the_burst_then_one_an_interval() {
        let rate = Rate { count: 10, per: Duration::from_secs(1) };
        let (t, tat) = gcra(None, 0, rate, 25);
        assert_eq!(t.granted, 10, "the burst is the count");
        let (t, tat) = gcra(Some(tat), 0, rate, 1);
        assert_eq!((t.granted, t.wait), (0, Duration::from_millis(100)));
        let (t, tat) = gcra(Some(tat), 100_000, rate, 5);
        assert_eq!(t.granted, 1, "one interval later, one more");
        let (t, _) = gcra(Some(tat), 10_000_000, rate, 3);
        assert_eq!(t.granted, 3, "an idle bucket refills to the burst");
    }

    #[test]
    fn a_zero_limit_is_refused() {
        let limits = Limits { concurrency: Some(0), ..Limits::default() };
        assert_eq!(limits.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
        assert!(Limits::default().is_none());
        let limits = Limits { concurrency: Some(2), key_rate: Some(Rate::per_second(5)), ..Limits::default() };
        assert_eq!(limits.to_string(), "2 at once, 5/1s per key");
    }
}
