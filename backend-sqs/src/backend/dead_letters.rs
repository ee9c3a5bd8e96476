//! `Broker`: failure records, kept in the [`RecordStore`] (the application's database) through the broker
//! kit ([`redrive_core::kit::broker`]), which gives [`DeadLetter`](redrive_core::DeadLetter) and
//! [`Replay`](redrive_core::Replay). The worker writes its records to the store directly; the
//! DLQ is the intake for what the redrive policy moved (a worker that crashed on its last
//! attempt) and for records written while the store was down.

use redrive_core::kit::broker::{self, Broker, Drained, Known};

use super::*;

impl Broker for SqsBackend {
    fn core(&self) -> &BrokerCore {
        &self.inner.core
    }

    async fn receive_dead(&self, hide: Duration) -> Result<Vec<Drained>> {
        let out = self
            .inner
            .client
            .receive_message()
            .queue_url(&self.inner.dlq.url)
            .max_number_of_messages(10)
            .visibility_timeout(secs(hide))
            // A long poll asks every SQS server, so an empty answer means an empty queue.
            .wait_time_seconds(self.inner.max_wait.min(Duration::from_secs(1)).as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk(e, "drain the dead-letter queue"))?;
        let messages = out.messages.unwrap_or_default();
        Ok(messages
            .iter()
            .map(|m| Drained {
                record: self.record_from_dlq(m),
                receipt: m.receipt_handle().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    async fn delete_dead(&self, drained: &[Drained]) -> Result<()> {
        let entries = drained.iter().enumerate().map(|(i, d)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&d.receipt)
                .build()
                .expect("id and receipt are set")
        });
        self.inner
            .client
            .delete_message_batch()
            .queue_url(&self.inner.dlq.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| sdk(e, "delete drained dead letters"))?;
        Ok(())
    }

    async fn show_dead_again(&self, drained: &[Drained]) {
        let entries = drained.iter().enumerate().map(|(i, d)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&d.receipt)
                .visibility_timeout(0)
                .build()
                .expect("id and receipt are set")
        });
        let shown = self
            .inner
            .client
            .change_message_visibility_batch()
            .queue_url(&self.inner.dlq.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await;
        if let Err(e) = shown {
            warn!(error = %sdk(e, "show dead letters again"), "dead letters stay hidden until their visibility lapses");
        }
    }

    fn check_job(&self, job: &NewJob) -> Result<()> {
        self.outgoing(job).map(drop)
    }

    /// FIFO: deduplicated by the record, not the key, or a replay within five minutes of the
    /// job's first send would be dropped.
    async fn send_replay(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        self.send(job, format!("replay-{record}"), "replay").await
    }
}

impl SqsBackend {
    /// The record a DLQ message holds: one the worker sent there (the store was down), or one
    /// the redrive policy moved, which has none of the worker's attributes.
    fn record_from_dlq(&self, m: &Message) -> FailureRecord {
        let message_id = m.message_id().unwrap_or_default().to_owned();
        let body = m.body().unwrap_or_default();
        let attrs = m.message_attributes();
        let attr = |name: &str| attrs.and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned);
        let system = m.attributes().cloned().unwrap_or_default();
        let failed_at = attr(ATTR_FAILED_AT)
            .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
            .map_or_else(|| sent_at(&system), |t| t.with_timezone(&Utc));
        // Receives, plus those a deferred copy carried over.
        let moved = || self.inner.max_receive_count.saturating_add(attrs.map_or(0, spent));
        let attempts = attr(ATTR_ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or_else(moved);
        let (env, undecodable) = carried_job(&message_id, body, attrs, failed_at);
        let last_error = attr(ATTR_ERROR).or(undecodable).unwrap_or_else(|| {
            format!(
                "moved by the redrive policy after {attempts} attempts (a worker stopped during the last one); no \
                 worker recorded an error"
            )
        });
        let mut errors = carried_errors(attrs);
        if errors.last().is_none_or(|e| e.attempt < attempts) {
            errors.push(AttemptError {
                attempt: attempts,
                at: failed_at,
                error: broker::cut(&last_error, broker::HISTORY_ERROR_LEN).into(),
            });
        }
        // The id the worker gives a record: the source message's, which the redrive policy keeps.
        let id = attr(ATTR_SOURCE_ID).unwrap_or_else(|| message_id.clone());
        let job_id = JobId(attr(ATTR_JOB_ID).unwrap_or_else(|| id.clone()));
        broker::dead_record((FailureId(id), job_id), env, last_error, errors, attempts, failed_at)
    }
}

/// The job a message carries, its envelope or a stand-in (see [`broker::carried_job`]) named by
/// the attributes a producer set.
pub(super) fn carried_job(
    id: &str,
    body: &str,
    attrs: Option<&HashMap<String, MessageAttributeValue>>,
    sent: DateTime<Utc>,
) -> (Envelope, Option<String>) {
    let attr = |name: &str| attrs.and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned);
    let known = Known { kind: attr(ATTR_KIND), key: attr(ATTR_KEY), provider_key: attr(ATTR_PROVIDER_KEY) };
    broker::carried_job("sqs", id, body, known, sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_is_not_an_envelope_is_carried_as_it_is() {
        let (env, undecodable) = carried_job("m-1", "<xml/>", None, Utc::now());
        let why = undecodable.expect("not an envelope");
        assert!(why.starts_with("the message body is not a redrive envelope: "), "{why}");
        assert!(!why.contains("xml"), "the body is not quoted: {why}");
        assert_eq!((env.key.as_str(), env.cap), ("sqs:message=m-1", 1));
        assert_eq!(env.payload, Value::String("<xml/>".into()));
    }
}
