//! `Broker`: failure records, kept in the records database through the broker kit
//! ([`redrive_core::kit::broker`]), which gives [`DeadLetter`](redrive_core::DeadLetter) and
//! [`Replay`](redrive_core::Replay). Nothing is drained: a dead letter keeps its record in the
//! transaction that archives its message.

use redrive_core::kit::Taken;
use redrive_core::kit::broker::{Broker, Drained, REPLAY_WINDOW};
use redrive_core::{FailureId, RecordState, ReplayOutcome};

use super::*;

impl Broker for PgmqBackend {
    fn core(&self) -> &BrokerCore {
        &self.inner.core
    }

    async fn receive_dead(&self, _hide: Duration) -> Result<Vec<Drained>> {
        Ok(Vec::new())
    }

    async fn delete_dead(&self, _drained: &[Drained]) -> Result<()> {
        Ok(())
    }

    async fn show_dead_again(&self, _drained: &[Drained]) {}

    fn check_job(&self, job: &NewJob) -> Result<()> {
        self.outgoing(job).map(drop)
    }

    async fn send_replay(&self, job: &NewJob, _record: &FailureId) -> Result<JobId> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin replay"))?;
        let id = self.send_under_key(&mut tx, job).await?;
        tx.commit().await.map_err(|e| db(e, "commit replay"))?;
        Ok(id)
    }

    /// The record taken, its job sent under its key and the record closed in one transaction of
    /// the one database: a replay either happened whole or not at all.
    async fn replay_at_once(
        &self,
        job: &NewJob,
        record: &FailureId,
        closed: &RecordState,
    ) -> Result<Option<ReplayOutcome>> {
        let (records, scope) = (&self.inner.records, self.inner.core.scope());
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin replay"))?;
        if let Taken::Closed(state) = records.take_record_in(&mut tx, scope, record, REPLAY_WINDOW).await? {
            return Ok(Some(ReplayOutcome::AlreadyClosed(state)));
        }
        let id = self.send_under_key(&mut tx, job).await?;
        if let Some(state) = records.close_record_in(&mut tx, scope, record, closed).await? {
            // Settled by another writer between the take and the close: nothing is sent.
            return Ok(Some(ReplayOutcome::AlreadyClosed(state)));
        }
        tx.commit().await.map_err(|e| db(e, "commit replay"))?;
        Ok(Some(ReplayOutcome::Replayed(id)))
    }

    /// A closed record's archived message goes: the record keeps what is kept of the job.
    async fn forget_dead(&self, record: &FailureId) -> Result<()> {
        let Ok(id) = record.0.parse::<i64>() else { return Ok(()) };
        q(&self.inner.sql.archive_forget_one)
            .bind(id)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "delete a closed record's archived message"))?;
        Ok(())
    }

    /// Archived messages go with the records a purge of `age` removes, and the keys of failed
    /// jobs those records were the last of: the key is free again.
    async fn purge_dead(&self, age: Duration) -> Result<()> {
        q(&self.inner.sql.archive_purge)
            .bind(seconds(age))
            .bind(self.inner.core.scope())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "purge archived messages"))?;
        Ok(())
    }
}
