//! Failure records, kept in the [`RecordStore`] (the application's database). The worker writes
//! its records there directly; the DLQ is the intake for what the redrive policy moved (a worker
//! that crashed on its last attempt) and for records written while the store was down, and is
//! drained into the store before records are read.

use super::*;

/// How long a replay holds its record: a second replay within it sends nothing; a replay that
/// died between taking the record and closing it leaves the record open again after it.
const REPLAY_WINDOW: Duration = Duration::from_secs(300);
/// DLQ pages a drain takes at most in one go (10 messages each); the rest wait for the next read.
const DRAIN_PAGES: usize = 2_000;
/// How long a drain holds a DLQ message between receiving it and deleting it once stored.
const DRAIN_VISIBILITY: i32 = 60;
/// How [`carried_job`] says a body is not an envelope; such a record cannot be replayed.
const NOT_AN_ENVELOPE: &str = "the message body is not a redrive envelope";

impl DeadLetter for SqsBackend {
    /// Drains the DLQ into the store on the first page, then reads the store: complete, and
    /// hiding nothing from other readers.
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        if query.after.is_none() {
            self.drain().await?;
        }
        self.inner.records.records(&self.inner.scope, query).await
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        match self.inner.records.record(&self.inner.scope, id).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.drain().await?;
                self.inner.records.record(&self.inner.scope, id).await
            }
            found => found,
        }
    }

    async fn count_open(&self) -> Result<u64> {
        self.drain().await?;
        self.inner.records.open_records(&self.inner.scope).await
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        let record = self.get(id).await?;
        let state = RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        if self.inner.records.close_record(&self.inner.scope, id, &state).await?.is_none() {
            info!(record = %id, kind = %record.kind, key = %record.key, actor, reason, "failure record discarded");
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        self.drain().await?;
        self.inner.records.purge_records(&self.inner.scope, age).await
    }
}

impl Replay for SqsBackend {
    /// Takes the record in the store (so that no other replay, in any process, sends it), sends
    /// the job back with its original keys, then closes the record. Retried after a failure
    /// past the send, within five minutes, it sends nothing more; a replay that died before
    /// closing leaves the record open again after five minutes, and a replay then sends it
    /// again (the effect ledger keeps the effect to one).
    async fn replay(&self, id: &FailureId) -> Result<ReplayOutcome> {
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
        self.outgoing(&job)?;
        if let Taken::Closed(state) = self.inner.records.take_for_replay(&self.inner.scope, id, REPLAY_WINDOW).await? {
            return Ok(ReplayOutcome::AlreadyClosed(state));
        }
        // FIFO: not the key, or a replay within five minutes of the first send would be dropped.
        let sent = match self.send(&job, format!("replay-{id}"), "replay").await {
            Ok(sent) => sent,
            Err(e) => {
                // Refused by SQS (the sender's fault): nothing was sent, the record is open again
                // at once. A timeout or a server error may have sent it: the record stays taken
                // until the window lapses, so that a retry now sends nothing twice.
                if e.retry() == Retry::Permanent {
                    let _ = self.inner.records.close_record(&self.inner.scope, id, &RecordState::Open).await;
                }
                return Err(e);
            }
        };
        if self.inner.fail_after_replay_send.load(Ordering::Relaxed) {
            return Err(Error::temporary("injected: the replay stopped after its send"));
        }
        self.inner.records.close_record(&self.inner.scope, id, &RecordState::Replayed { at: Utc::now() }).await?;
        info!(record = %id, kind = %record.kind, key = %record.key, job = %sent, "failure record replayed");
        Ok(ReplayOutcome::Replayed(sent))
    }
}

impl SqsBackend {
    /// Moves the DLQ's messages into the store: each received, kept, then deleted. Safe to run
    /// from many processes at once (each takes other messages) and to repeat (a record is kept
    /// once by its id). A message received by a drain that died is taken again a minute later.
    pub(super) async fn drain(&self) -> Result<()> {
        let _draining = self.inner.draining.lock().await;
        for _ in 0..DRAIN_PAGES {
            let out = self
                .inner
                .client
                .receive_message()
                .queue_url(&self.inner.dlq.url)
                .max_number_of_messages(10)
                .visibility_timeout(DRAIN_VISIBILITY)
                // A long poll asks every SQS server, so an empty answer means an empty queue.
                .wait_time_seconds(self.inner.max_wait.min(Duration::from_secs(1)).as_secs() as i32)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sdk(e, "drain the dead-letter queue"))?;
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() {
                return Ok(());
            }
            let records: Vec<FailureRecord> = messages.iter().map(|m| self.record_from_dlq(m)).collect();
            let new = match self.inner.records.keep_records(&self.inner.scope, &records).await {
                Ok(new) => new,
                Err(e) => {
                    // Visible again at once, for the next read, rather than in a minute.
                    self.show_again(&messages).await;
                    return Err(e);
                }
            };
            if new > 0 {
                info!(records = new, "failure records taken from the dead-letter queue");
            }
            let entries = messages.iter().enumerate().map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
                    .expect("id and receipt are set")
            });
            // A message not deleted comes back and is kept again, which changes nothing.
            self.inner
                .client
                .delete_message_batch()
                .queue_url(&self.inner.dlq.url)
                .set_entries(Some(entries.collect()))
                .send()
                .await
                .map_err(|e| sdk(e, "delete drained dead letters"))?;
        }
        Ok(())
    }

    async fn show_again(&self, messages: &[Message]) {
        let entries = messages.iter().enumerate().map(|(i, m)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
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
                error: cut(&last_error, HISTORY_ERROR_LEN).into(),
            });
        }
        // The id the worker gives a record: the source message's, which the redrive policy keeps.
        let id = attr(ATTR_SOURCE_ID).unwrap_or_else(|| message_id.clone());
        FailureRecord {
            id: FailureId(id.clone()),
            job_id: JobId(attr(ATTR_JOB_ID).unwrap_or(id)),
            kind: env.kind,
            key: env.key,
            provider_key: env.provider_key,
            payload: env.payload,
            last_error,
            first_failed_at: errors.first().map_or(failed_at, |e| e.at),
            errors,
            attempts,
            cap: env.cap,
            severity: env.severity,
            last_failed_at: failed_at,
            state: RecordState::Open,
        }
    }
}
