//! What a worker did: the counters behind [`WorkerStats`] and the `redrive_jobs_total` metric.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of what a worker did, for tests, metrics and the quickstart's evidence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs claimed.
    pub claimed: u64,
    /// Handlers that succeeded (effect done, job complete).
    pub succeeded: u64,
    /// Jobs acknowledged without running because the ledger said the effect was done.
    pub skipped: u64,
    /// Jobs put back without spending an attempt: another attempt held the key, no handler for
    /// the kind, the effect ledger was unreachable, or the handler said "not now".
    pub deferred: u64,
    /// Failed attempts put back for a retry.
    pub retried: u64,
    /// Failure records written.
    pub dead_lettered: u64,
    /// Running jobs given back when the shutdown grace ran out, at no attempt's cost.
    pub released: u64,
    /// Claimed jobs given back before they started: at shutdown, or after waiting half their
    /// lease in the buffer.
    pub handed_back: u64,
    /// Settlements refused because the lease had moved on.
    pub lease_lost: u64,
    /// Handlers cancelled because their key's hold could not be renewed before it lapsed.
    pub cancelled: u64,
    /// Handlers cancelled at their kind's timeout (each a failed attempt, also counted as retried
    /// or dead-lettered).
    pub timed_out: u64,
    /// Alerts delivered (one per record and sink).
    pub alerted: u64,
    /// Jobs dropped unrun because they were claimed past their deadline (work worthless late).
    pub expired: u64,
    /// Handlers stopped because a person cancelled their running job
    /// ([`Jobs::cancel_job`](crate::Jobs::cancel_job)).
    pub stopped: u64,
    /// Jobs completed unrun because a person cancelled their key in the effect ledger
    /// ([`Ledger::cancel_effect`](crate::kit::Ledger::cancel_effect): a broker's cancel).
    pub withdrawn: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters([AtomicU64; 15]);

#[derive(Clone, Copy)]
pub(super) enum Count {
    Claimed,
    Succeeded,
    Skipped,
    Deferred,
    Retried,
    DeadLettered,
    Released,
    HandedBack,
    LeaseLost,
    Cancelled,
    Alerted,
    Expired,
    TimedOut,
    Stopped,
    Withdrawn,
}

impl Count {
    /// The `outcome` label of `redrive_jobs_total`.
    fn name(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Succeeded => "succeeded",
            Self::Skipped => "skipped",
            Self::Deferred => "deferred",
            Self::Retried => "retried",
            Self::DeadLettered => "dead_lettered",
            Self::Released => "released",
            Self::HandedBack => "handed_back",
            Self::LeaseLost => "lease_lost",
            Self::Cancelled => "cancelled",
            Self::Alerted => "alerted",
            Self::Expired => "expired",
            Self::TimedOut => "timed_out",
            Self::Stopped => "stopped",
            Self::Withdrawn => "withdrawn",
        }
    }
}

impl Counters {
    /// Counts `n` of `which` where the kind is not known (a lost lease): the stats, and the
    /// `redrive_jobs_total` metric with an empty kind.
    pub(super) fn add(&self, which: Count, n: u64) {
        self.add_for(which, "", n);
    }

    /// Counts `n` of `which` for jobs of `kind`: the stats, and the `redrive_jobs_total`
    /// metric (labels: kind and outcome; never a key or a payload value).
    pub(super) fn add_for(&self, which: Count, kind: &str, n: u64) {
        self.0[which as usize].fetch_add(n, Ordering::Relaxed);
        metrics::counter!("redrive_jobs_total", "kind" => kind.to_owned(), "outcome" => which.name()).increment(n);
    }

    pub(super) fn snapshot(&self) -> WorkerStats {
        let get = |c: Count| self.0[c as usize].load(Ordering::Relaxed);
        WorkerStats {
            claimed: get(Count::Claimed),
            succeeded: get(Count::Succeeded),
            skipped: get(Count::Skipped),
            deferred: get(Count::Deferred),
            retried: get(Count::Retried),
            dead_lettered: get(Count::DeadLettered),
            released: get(Count::Released),
            handed_back: get(Count::HandedBack),
            lease_lost: get(Count::LeaseLost),
            cancelled: get(Count::Cancelled),
            alerted: get(Count::Alerted),
            expired: get(Count::Expired),
            timed_out: get(Count::TimedOut),
            stopped: get(Count::Stopped),
            withdrawn: get(Count::Withdrawn),
        }
    }
}
