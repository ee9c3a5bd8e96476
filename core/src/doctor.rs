//! Configuration checks (`redrive doctor`): each rule of the seed's configuration advice, with a
//! verdict, what was found, and the fix. A backend reads its own facts and judges them; the
//! command prints them.

use std::time::Duration;

use serde::Serialize;

/// A rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The rule holds.
    Pass,
    /// It holds for now, or cannot be told from here: read `found`.
    Warn,
    /// It does not hold: jobs can be lost, repeated or go unseen until it is fixed.
    Fail,
}

/// One rule's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// A stable dotted id, for scripts (`pg.unique-key`).
    pub rule: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found (never a URL, a key's value or a payload).
    pub found: String,
    /// What to do, unless it passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// The rule holds.
    pub fn pass(rule: &'static str, found: impl Into<String>) -> Self {
        Self { rule, status: Status::Pass, found: found.into(), fix: None }
    }

    /// A warning, with what to do.
    pub fn warn(rule: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { rule, status: Status::Warn, found: found.into(), fix: Some(fix.into()) }
    }

    /// A failure, with the fix.
    pub fn fail(rule: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { rule, status: Status::Fail, found: found.into(), fix: Some(fix.into()) }
    }
}

/// What the checks cannot read from the backend: the workers' settings.
#[derive(Debug, Clone)]
pub struct Expect {
    /// How long after its record is written an alert must have been sent (the workers' alert
    /// sweep runs every minute).
    pub alert_grace: Duration,
    /// The workers' lease ([`WorkerConfig::lease`](crate::WorkerConfig)): a broker must hide a
    /// received message at least this long.
    pub lease: Duration,
    /// The largest attempt cap of the jobs ([`DEFAULT_CAP`](crate::DEFAULT_CAP) unless a kind
    /// sets its own): a broker's redrive must not move a message sooner.
    pub cap: u32,
    /// The longest a job may run (the largest [`Job::TIMEOUT`](crate::Job::TIMEOUT)), if known: a
    /// broker must be able to hide a message that long.
    pub job_timeout: Option<Duration>,
    /// An Azure Functions queue trigger reads the queue: it decodes base64 unless its host says
    /// otherwise, so plain-JSON messages fail it.
    pub functions: bool,
}

impl Default for Expect {
    fn default() -> Self {
        Self {
            alert_grace: Duration::from_secs(600),
            lease: crate::WorkerConfig::default().lease,
            cap: crate::DEFAULT_CAP,
            job_timeout: None,
            functions: false,
        }
    }
}

/// A migration as a store's migrations table keeps it: whether it finished, and the checksum of
/// the text it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// It ran to the end.
    pub success: bool,
    /// The checksum of its text as it ran.
    pub checksum: Vec<u8>,
}

/// The migrations rule, `rule`, of a store: `applied` by version against this build's `known`
/// (version, checksum). `migrate` is the fix for a store behind.
pub fn migrations<'a>(
    rule: &'static str,
    applied: &std::collections::BTreeMap<i64, Applied>,
    known: impl IntoIterator<Item = (i64, &'a [u8])>,
    migrate: &str,
) -> Check {
    let (mut missing, mut broken, mut versions) = (Vec::new(), Vec::new(), Vec::new());
    for (version, checksum) in known {
        versions.push(version);
        match applied.get(&version) {
            None => missing.push(version),
            Some(a) if !a.success => broken.push(format!("{version} failed half-way")),
            Some(a) if a.checksum != checksum => broken.push(format!("{version} was applied from another text")),
            Some(_) => {}
        }
    }
    let newer: Vec<i64> = applied.keys().filter(|v| !versions.contains(v)).copied().collect();
    if !missing.is_empty() {
        Check::fail(rule, format!("migrations {missing:?} are not applied"), migrate)
    } else if !broken.is_empty() {
        Check::fail(
            rule,
            format!("migration {}", broken.join(", migration ")),
            "restore the database from a backup of before the failed migration, then migrate again",
        )
    } else if !newer.is_empty() {
        Check::warn(
            rule,
            format!("migrations {newer:?} come from a newer redrive"),
            "upgrade this command to the workers' redrive version",
        )
    } else {
        Check::pass(rule, format!("all {} migrations applied", applied.len()))
    }
}

/// The ledger key that holds a record's first alert to the workers' first sink, done once it was
/// sent, with the sink's name as its result: what [`alerted`] reads where a record's id is not a
/// number the store can write the key from (a broker's records).
pub fn alert_key(record: &crate::FailureId) -> Option<crate::IdempotencyKey> {
    crate::worker::alerts::alert_key(record, 0, 0)
}

/// The rule that open records were alerted: `open` records, of which `unalerted` (ids) are older
/// than `expect.alert_grace` and have no alert sent, and `log_only` were alerted only to the log
/// ([`TracingAlerts`](crate::alert::TracingAlerts), the workers' sink when they are given none).
pub fn alerted(open: u64, unalerted: &[String], log_only: u64, expect: &Expect) -> Check {
    const RULE: &str = "alerts.open-records";
    let grace = format!("{}s", expect.alert_grace.as_secs());
    if unalerted.is_empty() && log_only > 0 {
        return Check::warn(
            RULE,
            format!("{log_only} of {open} open records were alerted only to the workers' log: they have no alert sink"),
            "give the workers a sink that reaches a person (`WorkerBuilder::alert`: `WebhookAlerts`, or your pager's)",
        );
    }
    if unalerted.is_empty() {
        return Check::pass(RULE, format!("{open} open records, each alerted (or younger than {grace})"));
    }
    Check::fail(
        RULE,
        format!(
            "{} of {open} open records are older than {grace} and were never alerted (records {})",
            unalerted.len(),
            unalerted.join(", ")
        ),
        "run a worker with an alert sink on this queue (its alert sweep sends them within a minute); a sink \
         that keeps failing is in the workers' log",
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn migrations_behind_broken_or_ahead_are_told_apart() {
        let ok = |checksum: &[u8]| Applied { success: true, checksum: checksum.to_vec() };
        let known = [(1, &b"a"[..]), (2, &b"b"[..])];
        let all: BTreeMap<i64, Applied> = [(1, ok(b"a")), (2, ok(b"b"))].into();
        assert_eq!(migrations("m", &all, known, "migrate").status, Status::Pass);
        let behind: BTreeMap<i64, Applied> = [(1, ok(b"a"))].into();
        let check = migrations("m", &behind, known, "migrate");
        assert_eq!((check.status, check.fix.as_deref()), (Status::Fail, Some("migrate")));
        assert!(check.found.contains("[2]"), "{check:?}");
        let changed: BTreeMap<i64, Applied> = [(1, ok(b"a")), (2, ok(b"x"))].into();
        assert!(migrations("m", &changed, known, "migrate").found.contains("another text"));
        let half: BTreeMap<i64, Applied> =
            [(1, ok(b"a")), (2, Applied { success: false, checksum: b"b".to_vec() })].into();
        assert!(migrations("m", &half, known, "migrate").found.contains("half-way"));
        let ahead: BTreeMap<i64, Applied> = [(1, ok(b"a")), (2, ok(b"b")), (3, ok(b"c"))].into();
        assert_eq!(migrations("m", &ahead, known, "migrate").status, Status::Warn);
    }
}
