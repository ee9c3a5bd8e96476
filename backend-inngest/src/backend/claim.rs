//! `Claim` and `Renew` on Inngest: parked calls taken under a lease token, and the verdicts that
//! answer them. A retry, a deferral and a hand-back answer with a mark (see `steps`: Inngest
//! memoizes it and calls again, and the next call sleeps the mark's wait); a dead
//! letter writes the record, then fails the run.

use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::broker::Lapse;
use redrive_core::kit::{Claim, Claimed, Kinds, Lease, Renew};
use redrive_core::{FailureId, FailureRecord, Result};
use tracing::warn;

use super::{InngestBackend, ParkedCall, Verdict};
use crate::steps::{Mark, error_at};

impl InngestBackend {
    /// What a parked call whose time ran out is answered: one no worker claimed goes back at no
    /// attempt's cost (a record, past the rounds, for a kind nothing here handles); one whose
    /// lease lapsed (its worker died or stalled) gets a 500, and Inngest's call again counts the
    /// attempt.
    pub(crate) async fn lapsed(&self, call: &ParkedCall, lapse: Lapse) -> Verdict {
        let job = &call.job;
        if lapse == Lapse::LeaseLapsed {
            warn!(job = %job.id, kind = %job.kind, key = %job.key, attempt = job.attempt,
                "a claimed Inngest call's lease lapsed; answered 500 for Inngest to call again");
            return Verdict::Again("the worker's lease lapsed".into());
        }
        let wanted = self.inner.parked.wanted(&job.kind);
        let unclaimed = if wanted { call.progress.unclaimed } else { call.progress.unclaimed + 1 };
        if unclaimed >= self.inner.config.unclaimed_rounds {
            let error = format!(
                "no worker in this process handles kind {}: the call was handed back unclaimed {unclaimed} times",
                job.kind
            );
            warn!(job = %job.id, kind = %job.kind, key = %job.key, rounds = unclaimed,
                "an Inngest call no worker here handles is dead-lettered as a record");
            let record = self.record_of(call, &error);
            if let Err(e) = self.inner.core.keep(&record).await {
                warn!(job = %job.id, error = %e, "the record could not be kept; the failure handler keeps it");
            }
            return Verdict::Fail(error);
        }
        // Back after the park limit: a kind no worker here handles comes back at that pace, not
        // at once in a loop of billed calls.
        let wait = if wanted { Duration::ZERO } else { self.inner.config.park_limit };
        Verdict::Mark(Mark { spent: job.attempt.saturating_sub(1), error: None, wait, unclaimed })
    }

    /// The record of the call's job failing now with `error`: its run's id, its history.
    pub(crate) fn record_of(&self, call: &ParkedCall, error: &str) -> FailureRecord {
        let history = call.progress.errors.clone();
        FailureRecord::from_job(FailureId(call.run_id.clone()), &call.job, error, history, Utc::now())
    }
}

impl Claim for InngestBackend {
    fn handles(&self, kinds: &Kinds) {
        self.inner.parked.handles(kinds);
    }

    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        Ok(self.inner.parked.claim(kinds, max, lease, wait).await)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&serde_json::Value>) -> Result<()> {
        self.inner.parked.settle(lease)?.answer(Verdict::Done)
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let call = self.inner.parked.settle(lease)?;
        let attempt = call.job.attempt;
        let error = error_at(attempt, error, Utc::now());
        // A mark's wait is at least a millisecond: the sleep is what ends the mark.
        let wait = delay.max(Duration::from_millis(1));
        let verdict = Verdict::Mark(Mark { spent: attempt, error: Some(error), wait, unclaimed: 0 });
        call.answer(verdict)
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let call = self.inner.parked.settle(lease)?;
        let spent = call.job.attempt.saturating_sub(1);
        let verdict = Verdict::Mark(Mark { spent, error: None, wait: delay, unclaimed: 0 });
        call.answer(verdict)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.parked.release(lease)
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let call = self.inner.parked.settle(&claimed.lease)?;
        // The failing attempt's trace id (see `Claim::dead_letter`), with the run's history.
        let mut record = self.record_of(&call, error);
        record.trace_id = claimed.job.trace_id().map(str::to_owned);
        let kept = self.inner.core.keep(&record).await;
        // The run fails whatever the store said: Inngest's failure event brings the job back to
        // the failure handler, which keeps the record then.
        call.answer(Verdict::Fail(redrive_core::kit::broker::last_error(error)))?;
        match kept {
            Ok(_) => Ok(Some(record)),
            Err(e) => {
                warn!(job = %claimed.job.id, error = %e,
                    "the failure record could not be kept; the run's failure event keeps it later");
                Ok(None)
            }
        }
    }

    async fn confirm_replay(&self, record: &FailureId) -> Result<()> {
        redrive_core::kit::broker::confirm_replay(self, record).await
    }

    async fn withdraw_replay(&self, record: &FailureId, cancel: &redrive_core::Cancellation) -> Result<()> {
        redrive_core::kit::broker::withdraw_replay(self, record, cancel).await
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for InngestBackend {
    /// Keeps the call parked `by` longer, up to the call's timeout: past it Inngest has stopped
    /// waiting, and the effect ledger's hold keeps its next call from running twice.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.inner.parked.renew(lease, by)?;
        Ok(lease.clone())
    }
}
