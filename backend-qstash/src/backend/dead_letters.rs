//! `Broker` on QStash: the DLQ is listed (its entries stay while their records are open) into
//! the record store by the broker kit's drain; a replay goes through QStash's DLQ retry.

use super::*;

impl QStashBackend {
    /// One page of this destination's DLQ entries. The list is asked for this destination only,
    /// and each entry is checked too: the DLQ is the account's, and another destination's
    /// entries are not this app's to read, alert on, discard or purge.
    pub(super) async fn dlq_page(&self, cursor: Option<&str>) -> Result<(Vec<DlqEntry>, Option<String>)> {
        let (entries, next) = self.inner.api.dlq_page(&self.inner.config.destination, cursor).await?;
        Ok((entries.into_iter().filter(|e| self.ours(e)).collect(), next))
    }

    fn ours(&self, entry: &DlqEntry) -> bool {
        entry.url.as_deref() == Some(self.inner.config.destination.as_str())
    }

    /// The record's DLQ entry, if it is there and this destination's. A record kept before
    /// records were scoped (another destination's entry) is refused: its message is not this
    /// app's to send again or delete.
    async fn entry_of(&self, record: &FailureId) -> Result<Option<DlqEntry>> {
        match self.inner.api.dlq_get(&record.0).await {
            Ok(entry) if self.ours(&entry) => Ok(Some(entry)),
            Ok(_) => Err(Error::new(
                ErrorKind::NotFound,
                format!("DLQ entry {record} belongs to another destination on this QStash account"),
            )
            .with_retry(redrive_core::Retry::Permanent)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Publishes a replayed job from its record, under a deduplication id of the record's: not
    /// the job's (QStash would swallow it for its window), and one replay of the record sends
    /// one message however often it is tried.
    async fn republish(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        let dedupe = dedupe_of(&[&self.dedupe_id(job), &record.0]);
        let message = self.first_message(job, &dedupe).await;
        let published =
            self.inner.api.publish(&self.inner.config.destination, self.inner.config.queue.as_deref(), message).await?;
        Ok(JobId(published.message_id))
    }
}

impl Broker for QStashBackend {
    fn core(&self) -> &BrokerCore {
        &self.inner.core
    }

    /// The next page of this drain's listing of the DLQ (entries stay there while open, so a
    /// listing rather than a receive); empty at its end, and the next drain starts over.
    async fn receive_dead(&self, _hide: Duration) -> Result<Vec<Drained>> {
        let cursor = match std::mem::replace(&mut *lock(&self.inner.cursor), Cursor::Start) {
            Cursor::End => return Ok(Vec::new()),
            Cursor::Start => None,
            Cursor::At(cursor) => Some(cursor),
        };
        let mut cursor = cursor;
        let entries = loop {
            let (entries, next) = self.dlq_page(cursor.as_deref()).await?;
            match next {
                // A page of other destinations' entries only (a filter QStash did not apply).
                Some(next) if entries.is_empty() => cursor = Some(next),
                next => {
                    if !entries.is_empty() {
                        *lock(&self.inner.cursor) = next.map_or(Cursor::End, Cursor::At);
                    }
                    break entries;
                }
            }
        };
        Ok(entries.iter().map(|e| Drained { record: dead::record_of(e), receipt: e.dlq_id.clone() }).collect())
    }

    /// Nothing: an entry stays in the DLQ while its record is open, for QStash's retry API.
    async fn delete_dead(&self, _drained: &[Drained]) -> Result<()> {
        Ok(())
    }

    async fn show_dead_again(&self, _drained: &[Drained]) {
        *lock(&self.inner.cursor) = Cursor::Start;
    }

    fn check_job(&self, job: &NewJob) -> Result<()> {
        job.check_fits(&self.capabilities())?;
        if job.cap.saturating_sub(1) > self.inner.config.max_retries {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "job {} has a cap of {} attempts; QStash retries at most {} times on this plan",
                    job.key, job.cap, self.inner.config.max_retries
                ),
            ));
        }
        Ok(())
    }

    /// QStash's retry API on the record's DLQ entry, once it is checked to be this
    /// destination's. An entry gone from the DLQ (deleted in the console, or past its
    /// retention) is published anew from the record; so is one whose retry QStash answers as
    /// deduplicated (the message's deduplication id still in its window: nothing was sent).
    async fn send_replay(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        let Some(entry) = self.entry_of(record).await? else {
            info!(record = %record, key = %job.key, "the DLQ entry is gone; the replay publishes the job from its record");
            return self.republish(job, record).await;
        };
        // The entry carries its last copy's attempts, history and retries: a replay starts over,
        // the job's id kept, sealed to the entry's body.
        let job_id = Carried::read(|name| dead::lookup(&entry.header, name)).job_id.unwrap_or(entry.message_id.clone());
        let carried = [job_id, "0".to_owned(), String::new(), String::new(), record.0.clone()];
        let seal = self.inner.seal.sign(&carried, dead::text(&entry.body, &entry.body_base64).as_bytes());
        let [job_id, spent, errors, unclaimed, replay_of] = carried;
        let forward = |name: &str| format!("Upstash-Forward-{name}");
        let mut fresh = vec![
            ("Upstash-Retries".to_owned(), job.cap.saturating_sub(1).to_string()),
            (forward(JOB_ID), job_id),
            (forward(SPENT), spent),
            (forward(ERRORS), errors),
            (forward(UNCLAIMED), unclaimed),
            (forward(SEAL), seal),
            (forward(REPLAY_OF), replay_of),
            (forward(COPIED_AT), Utc::now().timestamp_millis().to_string()),
        ];
        // The kind's flow control as it is now, not as it was when the job failed.
        fresh.extend(self.inner.flow.of(&job.kind).await);
        match self.inner.api.dlq_retry(&record.0, fresh).await {
            Ok(sent) if !sent.deduplicated => Ok(JobId(sent.message_id)),
            Ok(_) => {
                info!(record = %record, key = %job.key,
                    "QStash answered the DLQ retry as deduplicated (nothing sent); the replay publishes the job from its record");
                let sent = self.republish(job, record).await?;
                // QStash removes a retried entry; one left would only be drained again.
                if let Err(e) = self.inner.api.dlq_delete(std::slice::from_ref(&record.0)).await
                    && e.kind() != ErrorKind::NotFound
                {
                    warn!(record = %record, error = %e, "the replayed record's DLQ entry could not be deleted");
                }
                Ok(sent)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                info!(record = %record, key = %job.key, "the DLQ entry is gone; the replay publishes the job from its record");
                self.republish(job, record).await
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the record's DLQ entry if it is this destination's; another's (a record kept
    /// before records were scoped) stays where it is.
    async fn forget_dead(&self, record: &FailureId) -> Result<()> {
        match self.entry_of(record).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                warn!(record = %record, "the record's DLQ entry is another destination's: it is left in the DLQ");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        match self.inner.api.dlq_delete(std::slice::from_ref(&record.0)).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes the DLQ entries of the records the store is about to purge (by the store's
    /// failure times, which are what the purge goes by), found in this destination's listing
    /// of the DLQ only.
    async fn purge_dead(&self, age: Duration) -> Result<()> {
        let before = Utc::now() - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX);
        let mut query = FailureQuery { failed_before: Some(before), limit: 500, ..FailureQuery::default() };
        let mut purged = HashSet::new();
        loop {
            let page = self.inner.core.records().records(self.inner.core.scope(), &query).await?;
            purged.extend(page.iter().map(|r| r.id.0.clone()));
            match page.last() {
                Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                _ => break,
            }
        }
        let mut cursor = None;
        while !purged.is_empty() {
            let (entries, next) = self.dlq_page(cursor.as_deref()).await?;
            let ids: Vec<String> = entries.into_iter().map(|e| e.dlq_id).filter(|id| purged.remove(id)).collect();
            if !ids.is_empty() {
                self.inner.api.dlq_delete(&ids).await?;
            }
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(())
    }
}
