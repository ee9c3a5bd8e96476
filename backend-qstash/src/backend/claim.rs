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
        d: &Delivery,
        spent: u32,
        errors: &[AttemptError],
        unclaimed: u32,
        delay: Duration,
    ) -> Result<()> {
        if !Self::waits(d) {
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

    /// The claimed delivery `lease` names, now settled: no other settlement or lapse can take it.
    fn settle(&self, lease: &Lease) -> Result<Arc<Delivery>> {
        let delivery = self.inner.held.remove(&lease.token, &lease.token).ok_or_else(lease_lost)?;
        let mut state = lock(&delivery.state);
        match &*state {
            State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                *state = State::Settled;
                drop(state);
                Ok(delivery)
            }
            _ => Err(lease_lost()),
        }
    }

    /// The claimed delivery `lease` names, still held.
    fn held(&self, lease: &Lease) -> Result<Arc<Delivery>> {
        self.inner.held.with(&lease.token, &lease.token, |d| Arc::clone(d)).ok_or_else(lease_lost)
    }

    /// Whether the delivery's request still waits for its answer.
    fn waits(delivery: &Delivery) -> bool {
        lock(&delivery.verdict).as_ref().is_some_and(|sender| !sender.is_closed())
    }

    fn answer(delivery: &Delivery, verdict: Verdict) -> Result<()> {
        let sender = lock(&delivery.verdict).take().ok_or_else(lease_lost)?;
        // QStash stopped waiting (or the connection dropped): it delivers the message again.
        sender.send(verdict).map_err(|_| lease_lost())
    }

    /// Parks a verified delivery for the workers; called by the receiver.
    pub(crate) fn park(&self, delivery: Arc<Delivery>) {
        lock(&self.inner.waiting).push_back(delivery);
        self.inner.arrived.notify_waiters();
    }

    /// What a parked delivery whose time ran out is answered, if its time did run out: one no
    /// worker claimed goes back to QStash as a copy at no attempt's cost; one whose lease lapsed
    /// (its worker died or stalled) gets a 500, and QStash's retry counts the attempt.
    pub(crate) async fn lapse(&self, d: &Arc<Delivery>) -> Option<Verdict> {
        let now = Instant::now();
        let unclaimed = {
            // One lock order everywhere: `waiting`, then a delivery's `state`, then `held`.
            let mut waiting = lock(&self.inner.waiting);
            let mut state = lock(&d.state);
            let unclaimed = match &*state {
                State::Waiting if now >= d.unclaimed_by => {
                    waiting.retain(|w| !Arc::ptr_eq(w, d));
                    true
                }
                State::Claimed { token, until } if now >= *until => {
                    self.inner.held.remove(token, token);
                    false
                }
                _ => return None,
            };
            *state = State::Settled;
            unclaimed
        };
        if !unclaimed {
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt,
                "a claimed QStash delivery's lease lapsed; answered 500 for QStash to retry");
            return Some(Verdict::again(500, Duration::from_secs(1), "the worker's lease lapsed"));
        }
        let spent = d.job.attempt.saturating_sub(1);
        // A kind no claim of this process ever asked for would circulate for ever, billed each
        // round: counted, and past the bound a record. One left while its workers are busy is not.
        let unclaimed = if self.wanted(&d.job.kind) { d.carried.unclaimed } else { d.carried.unclaimed + 1 };
        if unclaimed >= self.inner.config.unclaimed_rounds {
            let error = format!(
                "no worker in this process handles kind {}: the delivery was handed back unclaimed {unclaimed} times",
                d.job.kind
            );
            warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, rounds = unclaimed,
                "a QStash delivery no worker here handles is dead-lettered as a record");
            return Some(Verdict {
                status: 489,
                retry_after: None,
                non_retryable: true,
                failed_at: Some(Utc::now().timestamp_millis()),
                trace_id: d.job.trace_id().map(str::to_owned),
                body: redrive_core::kit::broker::last_error(&error),
            });
        }
        // Delayed by the park limit: a kind no worker here handles comes back at that pace, not
        // at once in a loop of billed messages.
        let delay = self.inner.config.park_limit;
        Some(match self.publish_copy(d, spent, &d.carried.errors, unclaimed, delay).await {
            Ok(()) => Verdict::ok(),
            Err(e) if e.kind() == ErrorKind::LeaseLost => Verdict::again(500, Duration::from_secs(1), "gone"),
            Err(e) => {
                warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, error = %e,
                    "no worker claimed a QStash delivery and its copy could not be sent; QStash retries it");
                Verdict::again(503, Duration::from_secs(1), "no worker was free")
            }
        })
    }

    /// Forgets a delivery whose request is gone (QStash, or a proxy in front, closed the
    /// connection): no worker claims it, and a claim of it can no longer settle.
    pub(crate) fn forget(&self, d: &Arc<Delivery>) {
        let mut waiting = lock(&self.inner.waiting);
        let mut state = lock(&d.state);
        match std::mem::replace(&mut *state, State::Settled) {
            State::Waiting => waiting.retain(|w| !Arc::ptr_eq(w, d)),
            State::Claimed { token, .. } => {
                self.inner.held.remove(&token, &token);
            }
            State::Settled => return,
        }
        warn!(job = %d.job.id, kind = %d.job.kind, key = %d.job.key, attempt = d.job.attempt,
            "a QStash delivery's connection closed before its verdict; QStash delivers it again");
    }

    /// Remembers the kinds a claim asks for: deliveries of others are unhandled here.
    fn want(&self, kinds: &Kinds) {
        let mut wanted = lock(&self.inner.wanted);
        match (kinds, wanted.as_mut()) {
            (Kinds::Any, _) => *wanted = None,
            (Kinds::Only(kinds), Some(set)) => set.extend(kinds.iter().cloned()),
            (Kinds::Only(_), None) => {}
        }
    }

    /// Whether a claim of this process ever asked for `kind`.
    fn wanted(&self, kind: &str) -> bool {
        lock(&self.inner.wanted).as_ref().is_none_or(|set| set.contains(kind))
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

    fn take(&self, kinds: &Kinds, max: usize, lease: Duration) -> Vec<Claimed> {
        let mut waiting = lock(&self.inner.waiting);
        let mut taken = Vec::new();
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() && taken.len() < max {
            let wanted = kinds.wants(&waiting[i].job.kind) || waiting[i].job.undecodable.is_some();
            if !wanted {
                i += 1;
                continue;
            }
            let d = waiting.remove(i).expect("within the queue");
            let token = uuid::Uuid::new_v4().to_string();
            // Only a waiting delivery is in the list: every change from waiting removes it, under
            // this lock.
            *lock(&d.state) = State::Claimed { token: token.clone(), until: (now + lease).min(d.answer_by) };
            d.changed.notify_one();
            self.inner.held.insert(&token, &token, d.clone());
            taken.push(Claimed { job: d.job.clone(), lease: Lease { job_id: d.job.id.clone(), token }, begun: None });
        }
        taken
    }
}

impl Claim for QStashBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        self.want(kinds);
        let deadline = Instant::now() + wait;
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let taken = self.take(kinds, max, lease);
            if !taken.is_empty() || Instant::now() >= deadline {
                return Ok(taken);
            }
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    async fn complete(&self, lease: &Lease, _result: Option<&serde_json::Value>) -> Result<()> {
        Self::answer(&*self.settle(lease)?, Verdict::ok())
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let d = self.settle(lease)?;
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
        Self::answer(&d, verdict)
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let d = self.settle(lease)?;
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
        Self::answer(&d, verdict)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let d = self.held(lease)?;
        {
            let mut waiting = lock(&self.inner.waiting);
            let mut state = lock(&d.state);
            let current = matches!(&*state, State::Claimed { token, until }
                if *token == lease.token && Instant::now() <= *until);
            if !current || !Self::waits(&d) {
                return Err(lease_lost());
            }
            *state = State::Waiting;
            self.inner.held.remove(&lease.token, &lease.token);
            waiting.push_front(d.clone());
        }
        d.changed.notify_one();
        self.inner.arrived.notify_waiters();
        Ok(())
    }

    async fn dead_letter(&self, job: &Claimed, error: &str) -> Result<Option<redrive_core::FailureRecord>> {
        let d = self.settle(&job.lease)?;
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
        Self::answer(&d, verdict)?;
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
        let d = self.held(lease)?;
        {
            let mut state = lock(&d.state);
            match &mut *state {
                State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                    *until = (Instant::now() + by).min(d.answer_by);
                }
                _ => return Err(lease_lost()),
            }
        }
        d.changed.notify_one();
        Ok(lease.clone())
    }
}
