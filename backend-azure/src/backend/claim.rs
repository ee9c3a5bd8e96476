//! `Claim` and `Renew` on Azure: gets into the held table, and the verdicts on what is held,
//! each on the claim's current pop receipt.

use super::*;

/// How long a message being dead-lettered stays hidden while its record is written.
const RECORD_HIDE: Duration = Duration::from_secs(60);

impl AzureBackend {
    /// Waits for the message's turn, then gives its current pop receipt; calls on one message
    /// take turns. A receipt of this process's current claim stands for the latest; another (an
    /// older claim's) goes to Azure as it is, which refuses it if stale.
    async fn take_turn(&self, lease: &Lease) -> (String, Option<tokio::sync::OwnedMutexGuard<()>>) {
        let (id, token) = (&lease.job_id.0, &lease.token);
        let guard = match self.inner.held.with(id, token, |h| Arc::clone(&h.turn)) {
            Some(turn) => Some(turn.lock_owned().await),
            None => None,
        };
        (self.inner.held.latest(id, token).unwrap_or_else(|| token.clone()), guard)
    }

    /// Updates the message's visibility (and its text, if given) and returns the new pop
    /// receipt, remembered for the claim. The update runs on a task of its own that records the
    /// new receipt before it lets the next call on the message go: a caller that stops waiting
    /// (a renewal dropped because its handler finished) must not lose a receipt Azure has
    /// already swapped for the old one.
    async fn update(&self, lease: &Lease, visibility: Duration, text: Option<&Text>, what: &str) -> Result<String> {
        let (receipt, turn) = self.take_turn(lease).await;
        let backend = self.clone();
        let (lease, text, what) = (lease.clone(), text.map(|t| self.fitting(t)), what.to_owned());
        let update = tokio::spawn(async move {
            let _turn = turn;
            backend.update_now(&lease, &receipt, visibility, text.flatten(), &what).await
        });
        update.await.map_err(|_| Error::temporary("azure: the update's task stopped"))?
    }

    async fn update_now(
        &self,
        lease: &Lease,
        receipt: &str,
        visibility: Duration,
        text: Option<Text>,
        what: &str,
    ) -> Result<String> {
        let mut options = QueueClientUpdateMessageOptions::default();
        if let Some(text) = &text {
            let encoded = wire::encode(&text.body, self.inner.options.base64);
            options.queue_message =
                Some(QueueMessage { message_text: Some(encoded) }.try_into().map_err(|e| azure(e, what))?);
        }
        let seconds = visibility.min(MAX_VISIBILITY).as_secs_f64().ceil() as i32;
        let response = self
            .inner
            .source
            .update_message(&lease.job_id.0, receipt, seconds, Some(options))
            .await
            .map_err(|e| azure(e, what))?;
        let name = HeaderName::from_static("x-ms-popreceipt");
        let new = response
            .headers()
            .get_optional_str(&name)
            .map(str::to_owned)
            .ok_or_else(|| Error::temporary(format!("azure: {what} answered no pop receipt")))?;
        // The claim's first receipt (the worker's lease) and the latest few stand for it.
        self.inner.held.renew(&lease.job_id.0, &lease.token, new.clone(), |h| {
            if let Some(text) = text {
                h.text = text;
            }
        });
        Ok(new)
    }

    /// `text` as it fits in 64 KiB once encoded: whole, or without its error history (a
    /// producer's message near the limit), or not at all (the update then changes the visibility
    /// only, and the given-back receive is lost).
    fn fitting(&self, text: &Text) -> Option<Text> {
        let fits = |t: &Text| wire::encode(&t.body, self.inner.options.base64).len() <= wire::MAX_TEXT;
        if fits(text) {
            return Some(text.clone());
        }
        let lighter = text.with(Carried { errors: Vec::new(), ..text.carried.clone() });
        fits(&lighter).then_some(lighter)
    }

    /// Deletes the message behind `lease` from the source queue.
    async fn delete(&self, lease: &Lease, what: &str) -> Result<()> {
        let (receipt, _turn) = self.take_turn(lease).await;
        self.inner.source.delete_message(&lease.job_id.0, &receipt, None).await.map_err(|e| azure(e, what))?;
        self.forget(lease);
        Ok(())
    }

    /// Drops the held entry of the claim `lease` belongs to.
    fn forget(&self, lease: &Lease) {
        self.inner.held.remove(&lease.job_id.0, &lease.token);
    }

    /// The held text and attempt of the claim `lease` belongs to.
    fn held_text(&self, lease: &Lease) -> Option<(Text, u32)> {
        self.inner.held.with(&lease.job_id.0, &lease.token, |h| (h.text.clone(), h.attempt))
    }

    /// Hands the message back after `after`, its receive given back (a deferral, a release: the
    /// next receive is not a new attempt).
    async fn hand_back(&self, lease: &Lease, after: Duration, what: &str) -> Result<()> {
        let text = self.held_text(lease).map(|(text, _)| {
            let carried = Carried { given_back: text.carried.given_back + 1, ..text.carried.clone() };
            text.with(carried)
        });
        self.update(lease, after, text.as_ref(), what).await?;
        self.forget(lease);
        Ok(())
    }

    fn claimed_from(&self, m: ReceivedMessage) -> Option<Claimed> {
        let (id, receipt) = (m.message_id?, m.pop_receipt?);
        let text = Text::read(&m.message_text.unwrap_or_default());
        let dequeues = u32::try_from(m.dequeue_count.unwrap_or(1)).unwrap_or(u32::MAX).max(1);
        // Deferrals and releases give their receive back.
        let attempt = dequeues.saturating_sub(text.carried.given_back).max(1);
        let inserted = m
            .insertion_time
            .and_then(|t| DateTime::<Utc>::from_timestamp(t.unix_timestamp(), t.nanosecond()))
            .unwrap_or_else(Utc::now);
        // Not an envelope: handed over marked as such, so the worker records a decode failure
        // without looking for a handler, with the text kept for a person to read.
        let (env, undecodable) = text.job(&id, inserted);
        // Recorded already, and back because its delete failed: past the cap, so that the
        // worker records it again (kept once) rather than run it.
        let attempt = if text.carried.recorded { attempt.max(env.cap.saturating_add(1)) } else { attempt };
        let job = env.into_job(JobId(id.clone()), attempt, undecodable);
        self.inner.held.insert(&id, &receipt, Holding { text, attempt, turn: Arc::default() });
        Some(Claimed { job, lease: Lease { job_id: JobId(id), token: receipt }, begun: None })
    }
}

impl Claim for AzureBackend {
    /// Azure cannot get by kind: `kinds` is ignored, and the worker defers what it has no
    /// handler for. Azure has no long polling: an empty get waits out `wait` before it returns.
    async fn claim(&self, _kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(max.clamp(1, MAX_GET) as i32),
            visibility_timeout: Some(lease.min(MAX_VISIBILITY).as_secs_f64().ceil().max(1.0) as i32),
            ..Default::default()
        };
        let got = self.inner.source.receive_messages(Some(options)).await.map_err(|e| azure(e, "get messages"))?;
        let got = got.into_model().map_err(|e| azure(e, "read messages"))?;
        let claimed: Vec<_> = got.items.unwrap_or_default().into_iter().filter_map(|m| self.claimed_from(m)).collect();
        if claimed.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(claimed)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        self.delete(lease, "delete the finished message").await
    }

    /// The message waits out `delay` (up to Azure's 7 days) invisible, its text updated with
    /// this attempt's error, so that the record keeps every failed attempt.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let text = self.held_text(lease).map(|(text, attempt)| {
            let errors = broker::add_error(text.carried.errors.clone(), attempt, error);
            let carried = Carried { errors, ..text.carried.clone() };
            text.with(carried)
        });
        self.update(lease, delay, text.as_ref(), "retry").await?;
        self.forget(lease);
        Ok(())
    }

    /// The message waits out `delay` invisible (a longer one than 7 days comes back early and is
    /// deferred again); its text counts the receive as given back, so that no number of
    /// deferrals uses up attempts.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.hand_back(lease, delay, "defer").await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.hand_back(lease, Duration::ZERO, "release").await
    }

    /// The record goes to the store (under the message's id, so that a repeat keeps it once),
    /// then the message is deleted. With the store down, the record goes to the poison queue
    /// instead, and is drained into the store later. A crash between the two leaves the message
    /// to come back past its cap: the worker dead-letters it again without running it, and the
    /// store keeps its record once.
    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let (lease, job) = (&claimed.lease, &claimed.job);
        // Proves the lease is still this claim's (Azure refuses a stale pop receipt) before
        // anything is recorded, keeps the message hidden while the record is written, and marks
        // it recorded, should its delete fail and it come back before its cap.
        let marked =
            self.held_text(lease).map(|(text, _)| text.with(Carried { recorded: true, ..text.carried.clone() }));
        self.update(lease, RECORD_HIDE, marked.as_ref(), "hold the message while its record is kept").await?;
        let carried = self.held_text(lease).map(|(text, _)| text.carried.errors).unwrap_or_default();
        let record = FailureRecord::from_job(FailureId(lease.job_id.0.clone()), job, error, carried, Utc::now());
        if let Err(e) = self.inner.core.keep(&record).await {
            broker::store_down(job, &e);
            let text = wire::poison_text(&record, self.inner.options.base64);
            let ttl = self.inner.options.poison_time_to_live;
            self.send(&self.inner.poison, text, ttl, None, "send to the poison queue").await?;
        }
        #[cfg(feature = "test-hooks")]
        if self.inner.fail_after_record.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::temporary("injected: dead-lettering stopped after the record was kept"));
        }
        // Then off the queue. Not atomic: if this delete fails, the message comes back past its
        // cap and is dead-lettered again under the same record id, which keeps it once.
        self.delete(lease, "delete the dead-lettered message").await?;
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

impl Renew for AzureBackend {
    /// Update Message with the new visibility: Azure answers a new pop receipt, the new lease.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        let receipt = self.update(lease, by, None, "extend visibility").await?;
        Ok(Lease { job_id: lease.job_id.clone(), token: receipt })
    }
}
