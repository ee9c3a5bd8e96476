//! Failure records: the DLQ holds the open ones, `<dlq>-audit` the closed ones (replayed or
//! discarded, with when, why and who). Reading them is a scan that receives each message for a
//! moment and makes it visible again.

use super::*;

/// A failure record as stored, with the queue and receipt to delete it by.
pub(super) struct StoredRecord {
    record: FailureRecord,
    queue: String,
    receipt: String,
    /// Whether the message body is an envelope (a redrive-policy move can carry any body).
    is_envelope: bool,
}

impl DeadLetter for SqsBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let _reading = self.inner.scan.lock().await;
        let records = self.records().await?;
        let mut matching = records.into_iter().map(|(r, _, _)| r).filter(|r| query.matches(r));
        if let Some(after) = &query.after {
            // Skip up to and including the last record of the previous page.
            for r in matching.by_ref() {
                if r.id == *after {
                    break;
                }
            }
        }
        Ok(matching.take(query.page_size()).collect())
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let _reading = self.inner.scan.lock().await;
        self.records()
            .await?
            .into_iter()
            .map(|(r, _, _)| r)
            .find(|r| r.id == *id)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))
    }

    async fn count_open(&self) -> Result<u64> {
        let attrs = queue_attributes(&self.inner.client, &self.inner.dlq.url).await?;
        let count = |name: QueueAttributeName| attrs.get(&name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        Ok(count(QueueAttributeName::ApproximateNumberOfMessages)
            + count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            + count(QueueAttributeName::ApproximateNumberOfMessagesDelayed))
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        let _reading = self.inner.scan.lock().await;
        let found = self.records().await?.into_iter().find(|(r, _, _)| r.id == *id);
        let Some((mut record, queue, receipt)) = found else {
            return Err(Error::new(ErrorKind::NotFound, format!("no failure record {id}")));
        };
        if queue != self.inner.dlq.url {
            return Ok(()); // already closed
        }
        record.state = RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        info!(record = %record.id, kind = %record.kind, key = %record.key, actor, reason, "failure record discarded");
        self.close(&record, &receipt).await
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        let _reading = self.inner.scan.lock().await;
        let horizon = Utc::now() - age;
        let mut purged = 0;
        for (record, queue, receipt) in self.records().await? {
            if record.last_failed_at < horizon {
                self.inner
                    .client
                    .delete_message()
                    .queue_url(&queue)
                    .receipt_handle(receipt)
                    .send()
                    .await
                    .map_err(|e| sdk(e, "purge"))?;
                purged += 1;
            }
        }
        Ok(purged)
    }
}

impl Replay for SqsBackend {
    async fn replay(&self, id: &FailureId) -> Result<ReplayOutcome> {
        let _reading = self.inner.scan.lock().await;
        let found = self.stored_records().await?.into_iter().find(|s| s.record.id == *id);
        let Some(StoredRecord { mut record, queue, receipt, is_envelope }) = found else {
            return Err(Error::new(ErrorKind::NotFound, format!("no failure record {id}")));
        };
        if queue != self.inner.dlq.url {
            return Ok(ReplayOutcome::AlreadyClosed(record.state));
        }
        if !is_envelope {
            // Sent back wrapped in an envelope, its body would reach a handler as a job.
            return Err(Error::new(
                ErrorKind::Decode,
                format!(
                    "record {id} holds a message body that is not a redrive envelope: it cannot be replayed; \
                     enqueue the corrected job and discard the record"
                ),
            ));
        }
        // Back to the source with the original keys and payload.
        let mut job =
            NewJob::new(record.kind.clone(), record.key.clone(), record.payload.clone())?.with_cap(record.cap);
        job.provider_key = record.provider_key;
        job.severity = record.severity;
        // FIFO: not the key, or a replay within five minutes of the first send would be dropped.
        let sent = self.send(&job, format!("replay-{id}"), "replay").await?;
        record.state = RecordState::Replayed { at: Utc::now() };
        self.close(&record, &receipt).await?;
        Ok(ReplayOutcome::Replayed(sent))
    }
}

impl SqsBackend {
    /// Every message of `url`, received for a moment and made visible again at once.
    pub(super) async fn scan(&self, url: &str) -> Result<Vec<Message>> {
        let mut all: Vec<Message> = Vec::new();
        loop {
            let out = self
                .inner
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .visibility_timeout(30)
                .wait_time_seconds(0)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sdk(e, "read dead letters"))?;
            let page = out.messages.unwrap_or_default();
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        for chunk in all.chunks(10) {
            let entries = chunk.iter().enumerate().map(|(i, m)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .visibility_timeout(0)
                    .build()
                    .expect("id and receipt are set")
            });
            self.inner
                .client
                .change_message_visibility_batch()
                .queue_url(url)
                .set_entries(Some(entries.collect()))
                .send()
                .await
                .map_err(|e| sdk(e, "show dead letters again"))?;
        }
        Ok(all)
    }

    /// Open records from the DLQ and closed ones from the audit queue, oldest first, each with
    /// the queue and receipt to delete it by.
    pub(super) async fn records(&self) -> Result<Vec<(FailureRecord, String, String)>> {
        Ok(self.stored_records().await?.into_iter().map(|s| (s.record, s.queue, s.receipt)).collect())
    }

    pub(super) async fn stored_records(&self) -> Result<Vec<StoredRecord>> {
        let mut records = Vec::new();
        for m in self.scan(&self.inner.dlq.url).await? {
            let receipt = m.receipt_handle().unwrap_or_default().to_owned();
            let (record, is_envelope) = self.record_from_dlq(&m);
            records.push(StoredRecord { record, queue: self.inner.dlq.url.clone(), receipt, is_envelope });
        }
        for m in self.scan(&self.inner.audit_url).await? {
            let receipt = m.receipt_handle().unwrap_or_default().to_owned();
            if let Ok(record) = serde_json::from_str::<FailureRecord>(m.body().unwrap_or_default()) {
                let queue = self.inner.audit_url.clone();
                records.push(StoredRecord { record, queue, receipt, is_envelope: true });
            }
        }
        records.sort_by(|a, b| (a.record.last_failed_at, &a.record.id).cmp(&(b.record.last_failed_at, &b.record.id)));
        Ok(records)
    }

    /// The record a DLQ message holds, and whether its body is an envelope.
    fn record_from_dlq(&self, m: &Message) -> (FailureRecord, bool) {
        let id = m.message_id().unwrap_or_default().to_owned();
        let body = m.body().unwrap_or_default();
        let attrs = m.message_attributes();
        let attr = |name: &str| attrs.and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned);
        let system = m.attributes().cloned().unwrap_or_default();
        let failed_at = attr(ATTR_FAILED_AT)
            .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
            .map_or_else(|| sent_at(&system), |t| t.with_timezone(&Utc));
        // A message moved by the redrive policy (its worker crashed on the last attempt) has
        // none of the worker's attributes, and is still a record: its receives, plus those a
        // deferred copy carried over.
        let moved = || self.inner.max_receive_count.saturating_add(attrs.map_or(0, spent));
        let attempts = attr(ATTR_ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or_else(moved);
        let last_error = attr(ATTR_ERROR).unwrap_or_else(|| {
            format!("moved to the dead-letter queue by the redrive policy after {attempts} attempts; no worker recorded an error")
        });
        let (env, undecodable) = carried_job(&id, body, attrs, failed_at);
        let mut errors = carried_errors(attrs);
        if errors.is_empty() {
            errors.push(AttemptError { attempt: attempts, at: failed_at, error: last_error.clone() });
        }
        let first_failed_at = errors.first().map_or(failed_at, |e| e.at);
        let record = FailureRecord {
            id: FailureId(id.clone()),
            job_id: JobId(attr(ATTR_SOURCE_ID).unwrap_or(id)),
            kind: env.kind,
            key: env.key,
            provider_key: env.provider_key,
            payload: env.payload,
            last_error: last_error.clone(),
            errors,
            attempts,
            cap: env.cap,
            severity: env.severity,
            first_failed_at,
            last_failed_at: failed_at,
            state: RecordState::Open,
        };
        (record, undecodable.is_none())
    }

    async fn close(&self, record: &FailureRecord, dlq_receipt: &str) -> Result<()> {
        // The audit copy first: if the delete then fails, the record is closed twice rather
        // than lost.
        self.inner
            .client
            .send_message()
            .queue_url(&self.inner.audit_url)
            .message_body(serde_json::to_string(record).expect("a record serializes"))
            .send()
            .await
            .map_err(|e| sdk(e, "write the audit record"))?;
        self.inner
            .client
            .delete_message()
            .queue_url(&self.inner.dlq.url)
            .receipt_handle(dlq_receipt)
            .send()
            .await
            .map_err(|e| sdk(e, "delete the dead letter"))?;
        Ok(())
    }
}
