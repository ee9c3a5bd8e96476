//! `Broker`: failure records, kept in the [`RecordStore`] through the broker kit
//! ([`redrive_core::kit::broker`]), which gives [`DeadLetter`](redrive_core::DeadLetter) and
//! [`Replay`](redrive_core::Replay). The worker writes its records to the store directly; the
//! poison queue is the intake for records written while the store was down and for messages
//! other consumers (the Azure Functions trigger, a person) moved there.

use redrive_core::FailureId;
use redrive_core::kit::AttemptError;
use redrive_core::kit::broker::Drained;

use super::*;

impl Broker for AzureBackend {
    fn core(&self) -> &BrokerCore {
        &self.inner.core
    }

    async fn receive_dead(&self, hide: Duration) -> Result<Vec<Drained>> {
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(MAX_GET as i32),
            visibility_timeout: Some(hide.as_secs().max(1) as i32),
            ..Default::default()
        };
        let got =
            self.inner.poison.receive_messages(Some(options)).await.map_err(|e| azure(e, "drain the poison queue"))?;
        let got = got.into_model().map_err(|e| azure(e, "read poison messages"))?;
        Ok(got.items.unwrap_or_default().into_iter().filter_map(|m| self.drained(m)).collect())
    }

    async fn delete_dead(&self, drained: &[Drained]) -> Result<()> {
        for d in drained {
            let (id, receipt) = d.receipt.split_once('\n').unwrap_or_default();
            match self.inner.poison.delete_message(id, receipt, None).await.map_err(|e| azure(e, "delete drained")) {
                // Taken by another drain after this one's hide lapsed: kept once all the same.
                Err(e) if e.kind() == ErrorKind::LeaseLost => {}
                other => drop(other?),
            }
        }
        Ok(())
    }

    async fn show_dead_again(&self, drained: &[Drained]) {
        for d in drained {
            let (id, receipt) = d.receipt.split_once('\n').unwrap_or_default();
            if let Err(e) = self.inner.poison.update_message(id, receipt, 0, None).await {
                warn!(error = %azure(e, "show a poison message again"), "it stays hidden until its visibility lapses");
            }
        }
    }

    fn check_job(&self, job: &NewJob) -> Result<()> {
        self.outgoing(job).map(drop)
    }

    async fn send_replay(&self, job: &NewJob, _record: &FailureId) -> Result<JobId> {
        let text = self.outgoing(job)?;
        let (ttl, hidden) = (self.inner.options.time_to_live, self.send_delay(job));
        self.send(&self.inner.source, text, ttl, hidden, "replay").await
    }
}

impl AzureBackend {
    /// The record a poison message holds: one the worker wrote (the store was down), or a
    /// message another consumer moved there, an envelope or not.
    fn drained(&self, m: ReceivedMessage) -> Option<Drained> {
        let (id, receipt) = (m.message_id?, m.pop_receipt?);
        let text = Text::read(&m.message_text.unwrap_or_default());
        let receipt = format!("{id}\n{receipt}");
        if let Some(mut record) = wire::poison_record(&text) {
            record.state = RecordState::Open;
            return Some(Drained { record, receipt });
        }
        let moved_at = m
            .insertion_time
            .and_then(|t| DateTime::<Utc>::from_timestamp(t.unix_timestamp(), t.nanosecond()))
            .unwrap_or_else(Utc::now);
        let (env, undecodable) = text.job(&id, moved_at);
        let attempts = env.cap;
        let last_error = undecodable.unwrap_or_else(|| {
            "moved to the poison queue by another consumer (such as the Azure Functions trigger); no worker recorded \
             an error"
                .to_owned()
        });
        let mut errors = text.carried.errors.clone();
        errors.push(AttemptError { attempt: attempts, at: moved_at, error: broker::cut(&last_error, 512).into() });
        let record =
            broker::dead_record((FailureId(id.clone()), JobId(id)), env, last_error, errors, attempts, moved_at);
        Some(Drained { record, receipt })
    }
}
