//! `Claim` and `Renew` on SQS: receives into the held table, and the verdicts on what is held.

use super::*;

impl SqsBackend {
    /// `LeaseLost` if this process received the message again since `lease`.
    pub(super) fn fence(&self, lease: &Lease) -> Result<()> {
        self.inner.held.fence(&lease.job_id.0, &lease.token)
    }

    fn forget(&self, lease: &Lease) {
        self.inner.held.remove(&lease.job_id.0, &lease.token);
    }

    /// The held message behind `lease`, taken out of its entry: the caller sends it on or hands
    /// the message back, and the entry goes on fencing with its receipt alone.
    fn take_message(&self, lease: &Lease) -> Option<Kept> {
        self.inner.held.with(&lease.job_id.0, &lease.token, |h| h.message.take()).flatten()
    }

    /// After a deferral deleted the message: its entry goes, unless it fences an older lease.
    fn forget_deferred(&self, lease: &Lease) {
        self.inner.held.remove_if(&lease.job_id.0, &lease.token, |h| !h.supersedes);
    }

    /// Sends a copy of a held message (`body` and `attrs`) delayed by `delay` (at most SQS's 15
    /// minutes), then deletes the original. The copy first: if the delete then fails, both are
    /// delivered, which at-least-once delivery allows and the effect ledger dedupes; the other
    /// order could lose the job.
    async fn replace_by_copy(
        &self,
        lease: &Lease,
        body: String,
        attrs: HashMap<String, MessageAttributeValue>,
        delay: Duration,
        what: &str,
    ) -> Result<()> {
        self.inner
            .client
            .send_message()
            .queue_url(&self.inner.source.url)
            .message_body(body)
            .set_message_attributes(Some(attrs))
            .delay_seconds(delay.as_secs_f64().ceil() as i32)
            .send()
            .await
            .map_err(|e| sdk(e, what))?;
        self.forget_deferred(lease);
        self.inner.deleter.delete(lease.token.clone()).await
    }

    /// Hands the message back by its visibility; its body is no longer needed here.
    pub(super) async fn hand_back(&self, lease: &Lease, after: Duration, what: &str) -> Result<()> {
        self.set_visibility(lease, after, what).await?;
        self.take_message(lease);
        Ok(())
    }

    async fn set_visibility(&self, lease: &Lease, to: Duration, what: &str) -> Result<()> {
        self.fence(lease)?;
        self.inner
            .client
            .change_message_visibility()
            .queue_url(&self.inner.source.url)
            .receipt_handle(&lease.token)
            .visibility_timeout(secs(to))
            .send()
            .await
            .map_err(|e| sdk(e, what))?;
        Ok(())
    }

    /// The record as a DLQ message: the job's body with the record in attributes, the error
    /// cleaned of what SQS refuses and cut to fit the DLQ (a job from another producer may not
    /// have left the room enqueue keeps).
    async fn send_record_to_dlq(
        &self,
        lease: &Lease,
        job_id: &JobId,
        body: String,
        record: &FailureRecord,
        errors: &str,
    ) -> Result<()> {
        let mut last_error = record.last_error.as_str();
        let attrs = |last_error: &str| {
            HashMap::from([
                (ATTR_KIND.to_owned(), string_attr(&record.kind)),
                (ATTR_KEY.to_owned(), string_attr(record.key.as_str())),
                (ATTR_PROVIDER_KEY.to_owned(), string_attr(&record.provider_key.to_string())),
                (ATTR_ERROR.to_owned(), string_attr(last_error)),
                (ATTR_ATTEMPTS.to_owned(), string_attr(&record.attempts.to_string())),
                (
                    ATTR_FAILED_AT.to_owned(),
                    string_attr(&record.last_failed_at.to_rfc3339_opts(SecondsFormat::Millis, true)),
                ),
                (ATTR_SOURCE_ID.to_owned(), string_attr(&lease.job_id.0)),
                (ATTR_JOB_ID.to_owned(), string_attr(&job_id.0)),
                (ATTR_ERRORS.to_owned(), string_attr(errors)),
            ])
        };
        let over = message_size(&body, &attrs(last_error)).saturating_sub(self.inner.dlq.max_message_size);
        if over > 0 {
            last_error = redrive_core::kit::broker::cut(last_error, last_error.len().saturating_sub(over));
        }
        let attrs = attrs(last_error);
        self.send_to(
            &self.inner.dlq,
            body,
            attrs,
            (&record.key, lease.job_id.0.clone()),
            None,
            "send to the dead-letter queue",
        )
        .await?;
        Ok(())
    }

    fn claimed_from(&self, m: Message) -> Option<Claimed> {
        let (id, receipt) = (m.message_id?, m.receipt_handle?);
        let body = m.body.unwrap_or_default();
        let attrs = m.message_attributes.unwrap_or_default();
        let system = m.attributes.unwrap_or_default();
        let receives: u32 =
            system.get(&MessageSystemAttributeName::ApproximateReceiveCount).and_then(|v| v.parse().ok()).unwrap_or(1);
        // A deferred copy starts its receive count afresh: the spent attempts travel with it.
        let attempt = receives.saturating_add(spent(&attrs));
        let sent = sent_at(&system);
        // Not an envelope: handed over marked as such, so the worker records a decode failure
        // without looking for a handler, with the body kept for a person to read.
        let (env, undecodable) = carried_job(&id, &body, Some(&attrs), sent);
        // A copy (deferred or retried) carries its job's id: the first message's.
        let job_id = attrs.get(ATTR_JOB_ID).and_then(|v| v.string_value()).map_or_else(|| id.clone(), str::to_owned);
        let job = env.into_job(JobId(job_id), attempt, undecodable);
        let message = Some(Kept { body, attrs, attempt });
        self.inner.held.replace(&id, &receipt, |earlier| Holding {
            message,
            // An entry still holding its message was not settled: its lease may yet be presented.
            supersedes: earlier.is_some_and(|h| h.message.is_some() || h.supersedes),
        });
        // The effect ledger is not the queue: the worker asks it.
        Some(Claimed { job, lease: Lease { job_id: JobId(id), token: receipt }, begun: None })
    }
}

impl Claim for SqsBackend {
    /// SQS cannot receive by kind: `kinds` is ignored, and the worker defers what it has no
    /// handler for.
    async fn claim(&self, _kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let long_poll = wait.min(self.inner.max_wait);
        let out = self
            .inner
            .client
            .receive_message()
            .queue_url(&self.inner.source.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .wait_time_seconds(long_poll.as_secs() as i32)
            .visibility_timeout(secs(lease))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk(e, "receive"))?;
        let claimed: Vec<_> =
            out.messages.unwrap_or_default().into_iter().filter_map(|m| self.claimed_from(m)).collect();
        if claimed.is_empty() && long_poll < wait {
            // Short polling: honour the caller's wait here rather than have it ask again at once.
            tokio::time::sleep(wait - long_poll).await;
        }
        Ok(claimed)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        self.fence(lease)?;
        self.inner.deleter.delete(lease.token.clone()).await?;
        self.forget(lease);
        Ok(())
    }

    /// Like a deferral, a copy sent with the delay and the original deleted, but this attempt
    /// counted and its error added to the history the copy carries (`redrive-errors`), so that
    /// the record keeps every failed attempt. FIFO queues, and delays over SQS's 15 minutes, wait
    /// out the visibility instead: the attempt is counted, its error only logged.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        self.fence(lease)?;
        if self.inner.source.fifo || delay > MAX_DELAY {
            // The entry stays: this receipt fences an older one until the message is deleted.
            return self.hand_back(lease, delay, "retry").await;
        }
        let Some(Kept { body, mut attrs, attempt }) = self.take_message(lease) else {
            return self.set_visibility(lease, delay, "retry").await;
        };
        attrs.insert(ATTR_SPENT.to_owned(), string_attr(&attempt.to_string()));
        attrs.entry(ATTR_JOB_ID.to_owned()).or_insert_with(|| string_attr(&lease.job_id.0));
        let errors = history(&attrs, attempt, error);
        attrs.insert(ATTR_ERRORS.to_owned(), string_attr(&errors));
        self.replace_by_copy(lease, body, attrs, delay, "send the retried copy").await
    }

    /// A copy of the message, with the attempts spent before this receive, is sent with the
    /// delay, then the original is deleted: the copy's receive count starts afresh, so no number
    /// of deferrals reaches `maxReceiveCount`. FIFO queues refuse a per-message delay: there the
    /// message waits out its visibility instead, and this receive stays counted.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.fence(lease)?;
        if self.inner.source.fifo {
            return self.hand_back(lease, delay, "defer").await;
        }
        let Some(Kept { body, mut attrs, attempt }) = self.take_message(lease) else {
            // Only an entry dropped for age (a lease held past HELD_FOR among HELD_MAX others).
            warn!(message = %lease.job_id, "the deferred message is no longer held here; it waits out its visibility, counted");
            return self.set_visibility(lease, delay, "defer").await;
        };
        // The receive being deferred is given back: the copy has spent one less than this attempt.
        attrs.insert(ATTR_SPENT.to_owned(), string_attr(&attempt.saturating_sub(1).to_string()));
        attrs.entry(ATTR_JOB_ID.to_owned()).or_insert_with(|| string_attr(&lease.job_id.0));
        self.replace_by_copy(lease, body, attrs, delay.min(MAX_DELAY), "send the deferred copy").await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        // The receive count cannot be undone: the attempt stays counted.
        self.hand_back(lease, Duration::ZERO, "release").await
    }

    /// The record goes to the store (under the message's id, so that a repeat keeps it once),
    /// then the message is deleted. With the store down, the message goes to the DLQ with the
    /// record as attributes instead, and is drained into the store later.
    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let lease = &claimed.lease;
        self.fence(lease)?;
        let job = &claimed.job;
        // The message as received: the failed attempts it carries, and its body (a producer's
        // unknown fields, or a body that is not an envelope), re-encoded only when it is gone.
        let kept = self.inner.held.with(&lease.job_id.0, &lease.token, |h| {
            h.message.as_ref().map(|k| (k.body.clone(), carried_errors(Some(&k.attrs))))
        });
        let (kept_body, carried) = kept.flatten().unzip();
        let record = FailureRecord::from_job(
            FailureId(lease.job_id.0.clone()),
            job,
            error,
            carried.unwrap_or_default(),
            Utc::now(),
        );
        if let Err(e) = self.inner.core.keep(&record).await {
            redrive_core::kit::broker::store_down(job, &e);
            let body = kept_body.unwrap_or_else(|| Envelope::from_job(job).encode());
            let errors = history_text(&record.errors);
            self.send_record_to_dlq(lease, &job.id, body, &record, &errors).await?;
        }
        // Then off the source. Not atomic: if this delete fails, the message comes back and is
        // dead-lettered again under the same record id, which keeps it once.
        self.inner
            .client
            .delete_message()
            .queue_url(&self.inner.source.url)
            .receipt_handle(&lease.token)
            .send()
            .await
            .map_err(|e| sdk(e, "delete the dead-lettered message"))?;
        self.forget(lease);
        Ok(Some(record))
    }

    async fn confirm_replay(&self, record: &redrive_core::FailureId) -> Result<()> {
        redrive_core::kit::broker::confirm_replay(self, record).await
    }

    async fn withdraw_replay(
        &self,
        record: &redrive_core::FailureId,
        cancel: &redrive_core::Cancellation,
    ) -> Result<()> {
        redrive_core::kit::broker::withdraw_replay(self, record, cancel).await
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for SqsBackend {
    /// `ChangeMessageVisibility`; the receipt handle stays the same.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.set_visibility(lease, by, "extend visibility").await?;
        Ok(lease.clone())
    }
}
