//! `Claim` and `Renew` on QStash: parked deliveries taken under a lease token, and the verdicts
//! that answer them (a copy published first where the job goes on).

use super::*;

impl QStashBackend {
    /// Publishes the delivery's next copy after `delay`, carrying `spent` attempts, `errors` and
    /// `unclaimed` rounds, sealed: a retry, a deferral or a delivery handed back. Its
    /// deduplication id is the delivery's (message id and retry count): one delivery has one
    /// successor, so the same delivery made twice at once (one run, one deferred behind its
    /// hold) cannot fork the job into two chains.
    async fn publish_copy(
        &self,
        d: &Parcel,
        spent: u32,
        errors: &[AttemptError],
        unclaimed: u32,
        delay: Duration,
    ) -> Result<()> {
        if !d.waits() {
            // QStash stopped waiting and delivers the message again: no second chain.
            return Err(lease_lost());
        }
        let mut headers = self.common_headers(d.job.cap.saturating_sub(1).saturating_sub(spent));
        let dedupe = dedupe_of(&[&d.message_id, &d.retried.to_string()]);
        headers.push(("Upstash-Deduplication-Id".into(), dedupe));
        // The copy waits its turn under the kind's flow control, as the first message did.
        headers.extend(self.inner.flow.of(&d.job.kind).await);
        let delay = delay.min(MAX_DELAY);
        if delay >= Duration::from_millis(500) {
            headers.push(("Upstash-Delay".into(), format!("{}s", seconds(delay))));
        }
        let forward = |name: &str| format!("Upstash-Forward-{name}");
        let errors = if errors.is_empty() { String::new() } else { dead::encode_errors(errors) };
        let replay_of = d.carried.replay_of.clone().unwrap_or_default();
        let carried = [d.job.id.0.clone(), spent.to_string(), errors, unclaimed.to_string(), replay_of];
        headers.push((forward(SEAL), self.inner.seal.sign(&carried, d.body.as_bytes())));
        for (name, value) in [JOB_ID, SPENT, ERRORS, UNCLAIMED, REPLAY_OF].into_iter().zip(carried) {
            if !value.is_empty() {
                headers.push((forward(name), value));
            }
        }
        headers.push((forward(COPIED_AT), Utc::now().timestamp_millis().to_string()));
        let message = Outgoing { headers, body: d.body.clone() };
        self.inner.api.publish(&self.inner.config.destination, self.inner.config.queue.as_deref(), message).await?;
        Ok(())
    }

    /// What a parked delivery whose time ran out is answered: one no worker claimed goes back
    /// to QStash as a copy at no attempt's cost; one whose lease lapsed (its worker died or
    /// stalled) gets a 500, and QStash's retry counts the attempt.
    pub(crate) async fn lapsed(&self, d: &Parcel, lapse: Lapse) -> Verdict {
        if lapse == Lapse::LeaseLapsed {
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt,
                "a claimed QStash delivery's lease lapsed; answered 500 for QStash to retry");
            return Verdict::again(500, Duration::from_secs(1), "the worker's lease lapsed");
        }
        let spent = d.job.attempt.saturating_sub(1);
        // A kind no claim of this process ever asked for would circulate for ever, billed each
        // round: counted, and past the bound a record. One left while its workers are busy is not.
        let unclaimed =
            if self.inner.parked.wanted(&d.job.kind) { d.carried.unclaimed } else { d.carried.unclaimed + 1 };
        if unclaimed >= self.inner.config.unclaimed_rounds {
            let error = format!(
                "no worker in this process handles kind {}: the delivery was handed back unclaimed {unclaimed} times",
                d.job.kind
            );
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, rounds = unclaimed,
                "a QStash delivery no worker here handles is dead-lettered as a record");
            return Verdict {
                status: 489,
                retry_after: None,
                non_retryable: true,
                failed_at: Some(Utc::now().timestamp_millis()),
                trace_id: d.job.trace_id().map(str::to_owned),
                body: redrive_core::kit::broker::last_error(&error),
            };
        }
        // Delayed by the park limit: a kind no worker here handles comes back at that pace, not
        // at once in a loop of billed messages.
        let delay = self.inner.config.park_limit;
        match self.publish_copy(d, spent, &d.carried.errors, unclaimed, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => Verdict::again(500, Duration::from_secs(1), "gone"),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, error = %e,
                    "no worker claimed a QStash delivery and its copy could not be sent; QStash retries it");
                Verdict::again(503, Duration::from_secs(1), "no worker was free")
            }
        }
    }

    /// Remembers a refusal of `message_id` past the park bound (an hour; the oldest forgotten
    /// first past 10,000 messages).
    pub(crate) fn note_refusal(&self, message_id: &str) {
        let mut refused = lock(&self.inner.refused);
        let now = Instant::now();
        if refused.len() >= 10_000 {
            refused.retain(|_, (_, at)| now.duration_since(*at) < REFUSALS_KEPT);
            if refused.len() >= 10_000 {
                let oldest = refused.iter().min_by_key(|(_, (_, at))| *at).map(|(id, _)| id.clone());
                refused.remove(&oldest.unwrap_or_default());
            }
        }
        let entry = refused.entry(message_id.to_owned()).or_insert((0, now));
        *entry = (entry.0 + 1, now);
    }

    /// How many of a message's deliveries this process refused past the park bound: QStash
    /// counted them as retries, no worker started them.
    pub(crate) fn refusals(&self, message_id: &str) -> u32 {
        lock(&self.inner.refused).get(message_id).filter(|(_, at)| at.elapsed() < REFUSALS_KEPT).map_or(0, |(n, _)| *n)
    }
}

impl Claim for QStashBackend {
    fn handles(&self, kinds: &Kinds) {
        self.inner.parked.handles(kinds);
    }

    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        Ok(self.inner.parked.claim(kinds, max, lease, wait).await)
    }

    async fn complete(&self, lease: &Lease, _result: Option<&serde_json::Value>) -> Result<()> {
        self.inner.parked.settle(lease)?.answer(Verdict::ok())
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let d = self.inner.parked.settle(lease)?;
        let errors = redrive_core::kit::broker::add_error(d.carried.errors.clone(), d.job.attempt, error);
        let verdict = match self.publish_copy(&d, d.job.attempt, &errors, 0, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(e),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt, error = %e,
                    "the retry's copy could not be published; QStash retries the delivery itself");
                Verdict::again(500, delay.max(Duration::from_secs(1)), redrive_core::kit::broker::last_error(error))
            }
        };
        d.answer(verdict)
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let d = self.inner.parked.settle(lease)?;
        let spent = d.job.attempt.saturating_sub(1);
        let verdict = match self.publish_copy(&d, spent, &d.carried.errors, 0, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(e),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, error = %e,
                    "the deferral's copy could not be published; QStash retries the delivery itself");
                Verdict::again(503, delay.max(Duration::from_secs(1)), "deferred")
            }
        };
        d.answer(verdict)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.parked.release(lease)
    }

    async fn dead_letter(&self, job: &Claimed, error: &str) -> Result<Option<redrive_core::FailureRecord>> {
        let d = self.inner.parked.settle(&job.lease)?;
        let verdict = Verdict {
            status: 489,
            retry_after: None,
            non_retryable: true,
            failed_at: Some(Utc::now().timestamp_millis()),
            // The record is written from the entry's body later: the trace id it keeps (the
            // failing attempt's, see `Claim::dead_letter`) travels in the answer's headers.
            trace_id: job.job.trace_id().map(str::to_owned),
            body: redrive_core::kit::broker::last_error(error),
        };
        d.answer(verdict)?;
        // QStash writes the DLQ entry and names it: the alert sweep finds the record there.
        Ok(None)
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

impl Renew for QStashBackend {
    /// Keeps the delivery parked `by` longer, up to QStash's delivery timeout: past it QStash has
    /// stopped waiting, and the effect ledger's hold keeps its next delivery from running twice.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.inner.parked.renew(lease, by)?;
        Ok(lease.clone())
    }
}
