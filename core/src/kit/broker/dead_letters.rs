//! [`DeadLetter`] and [`Replay`] for every [`Broker`]: records read from the store, the
//! dead-letter queue drained into it first; a replay taken in the store, sent, then closed.

use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tracing::info;

use super::convert::NOT_AN_ENVELOPE;
use super::{Broker, drain};
use crate::backend::{
    Cancellation, DeadLetter, FailureId, FailureQuery, FailureRecord, RecordState, Replay, ReplayOutcome, refuse_amend,
    require_audit,
};
use crate::error::{Error, ErrorKind, Result, Retry};
use crate::job::NewJob;
use crate::records::Taken;

/// How long a replay holds its record: a second replay within it sends nothing; a replay that
/// died between taking the record and closing it leaves the record open again after it.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(300);

impl<B: Broker> DeadLetter for B {
    /// Drains the dead-letter queue into the store on the first page, then reads the store.
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        if query.after.is_none() {
            drain(self).await?;
        }
        self.core().records().records(self.core().scope(), query).await
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let core = self.core();
        match core.records().record(core.scope(), id).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                drain(self).await?;
                core.records().record(core.scope(), id).await
            }
            found => found,
        }
    }

    async fn count_open(&self) -> Result<u64> {
        drain(self).await?;
        self.core().records().open_records(self.core().scope()).await
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let record = self.get(id).await?;
        let state = RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        let core = self.core();
        if core.records().close_record(core.scope(), id, &state).await?.is_none() {
            info!(record = %id, kind = %record.kind, key = %record.key, actor, reason, "failure record discarded");
        }
        self.forget_dead(id).await
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        drain(self).await?;
        self.purge_dead(age).await?;
        self.core().records().purge_records(self.core().scope(), age).await
    }
}

/// What a broker's [`Claim::confirm_replay`](crate::kit::Claim::confirm_replay) does: settles the
/// replaying record `record` in the store as confirmed, logged by its id.
pub async fn confirm_replay<B: Broker>(broker: &B, record: &FailureId) -> Result<()> {
    let core = broker.core();
    if core.records().confirm_record(core.scope(), record).await? {
        info!(record = %record, "replay confirmed: its job's effect is done; the record is closed");
    }
    Ok(())
}

/// What a broker's [`Claim::withdraw_replay`](crate::kit::Claim::withdraw_replay) does: closes
/// the replaying record `record` in the store as discarded, with the cancel's who and why.
pub async fn withdraw_replay<B: Broker>(broker: &B, record: &FailureId, cancel: &Cancellation) -> Result<()> {
    let core = broker.core();
    let discarded = RecordState::Discarded {
        at: Utc::now(),
        reason: format!("its replayed job was cancelled: {}", cancel.reason),
        actor: cancel.actor.clone(),
    };
    if core.records().discard_replaying(core.scope(), record, &discarded).await? {
        info!(record = %record, actor = %cancel.actor, "replay withdrawn: its key was cancelled; the record is closed");
    }
    Ok(())
}

/// A replay in three steps, each its own write: the record taken in the store for
/// [`REPLAY_WINDOW`], `job` sent, the record closed as `replayed`. Retried after a failure past
/// the send, within the window, it sends nothing more; a replay that died before closing leaves
/// the record open again after the window, and a replay then sends it again (the effect ledger
/// keeps the effect to one).
async fn replay_in_steps<B: Broker>(
    broker: &B,
    job: &NewJob,
    id: &FailureId,
    replayed: &RecordState,
) -> Result<ReplayOutcome> {
    let core = broker.core();
    let (store, scope) = (core.records(), core.scope());
    if let Taken::Closed(state) = store.take_for_replay(scope, id, REPLAY_WINDOW).await? {
        return Ok(ReplayOutcome::AlreadyClosed(state));
    }
    let sent = match broker.send_replay(job, id).await {
        Ok(sent) => sent,
        Err(e) => {
            // Refused by the broker (the sender's fault): nothing was sent, the record is open
            // again at once. A timeout or a server error may have sent it: the record stays
            // taken until the window lapses, so that a retry now sends nothing twice.
            if e.retry() == Retry::Permanent {
                let _ = store.close_record(scope, id, &RecordState::Open).await;
            }
            return Err(e);
        }
    };
    if core.replay_stops_after_send() {
        return Err(Error::temporary("injected: the replay stopped after its send"));
    }
    store.close_record(scope, id, replayed).await?;
    Ok(ReplayOutcome::Replayed(sent))
}

impl<B: Broker> Replay for B {
    /// Takes the record in the store (so that no other replay, in any process, sends it), sends
    /// the job back with its original keys, then closes the record: in one transaction where the
    /// broker can ([`Broker::replay_at_once`]), else in three steps of their own, safe to retry
    /// within five minutes.
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        let record = self.get(id).await?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state));
        }
        if record.last_error.starts_with(NOT_AN_ENVELOPE) {
            // Sent back wrapped in an envelope, its body would reach a handler as a job.
            return Err(Error::new(
                ErrorKind::Decode,
                format!(
                    "record {id} holds a message body that is not a redrive envelope: it cannot be replayed; \
                     enqueue the corrected job and discard the record"
                ),
            ));
        }
        // Checked before the take: a job that cannot be sent leaves the record as it was.
        let mut job =
            NewJob::new(record.kind.clone(), record.key.clone(), record.payload.clone())?.with_cap(record.cap);
        job.provider_key = record.provider_key;
        job.severity = record.severity;
        job.replay_of = Some(id.clone());
        self.check_job(&job)?;
        let replayed = RecordState::replaying(reason, actor, false);
        let outcome = match self.replay_at_once(&job, id, &replayed).await? {
            Some(outcome) => outcome,
            None => replay_in_steps(self, &job, id, &replayed).await?,
        };
        if let ReplayOutcome::Replayed(sent) = &outcome {
            info!(record = %id, kind = %record.kind, key = %record.key, job = %sent, actor, reason, "failure record replayed");
        }
        Ok(outcome)
    }

    /// A broker's effect ledger is kept apart from its records: an amended payload would meet
    /// the key's old fingerprint there and end as a key conflict. Refused.
    async fn replay_amended(
        &self,
        id: &FailureId,
        _payload: &Value,
        _reason: &str,
        _actor: &str,
    ) -> Result<ReplayOutcome> {
        Err(refuse_amend(id))
    }
}
