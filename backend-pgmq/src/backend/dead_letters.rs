//! `Broker`: failure records, kept in the records database through the broker kit
//! ([`redrive_core::kit::broker`]), which gives [`DeadLetter`](redrive_core::DeadLetter) and
//! [`Replay`](redrive_core::Replay). Nothing is drained: a dead letter keeps its record in the
//! transaction that archives its message.

use redrive_core::FailureId;
use redrive_core::kit::broker::{Broker, Drained};

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
        self.send_under_key(job).await
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
