//! The in-memory failure records: listed, discarded, purged and replayed.

use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio::time::Instant;

use super::ledger::Effect;
use super::{MemoryBackend, Status, parse_id};
use crate::backend::{
    Blocked, DeadLetter, FailureId, FailureQuery, FailureRecord, RecordState, Replay, ReplayOutcome, require_audit,
};
use crate::error::{Error, ErrorKind, Result};
use crate::job::{NewJob, payload_fingerprint};
use crate::key::IdempotencyKey;

impl DeadLetter for MemoryBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let after = query.after.as_ref().map(|id| parse_id(&id.0)).transpose()?.unwrap_or(0);
        let state = self.lock();
        let page = state.records.range(after + 1..).map(|(_, r)| r).filter(|r| query.matches(r));
        Ok(page.take(query.page_size()).cloned().collect())
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let n = parse_id(&id.0)?;
        self.lock()
            .records
            .get(&n)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))
    }

    async fn count_open(&self) -> Result<u64> {
        Ok(self.lock().records.values().filter(|r| r.state.is_open()).count() as u64)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let n = parse_id(&id.0)?;
        let mut state = self.lock();
        let record = state
            .records
            .get_mut(&n)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        if record.state.is_open() {
            record.state =
                RecordState::Discarded { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
            // Dropped work no longer holds its order key's later jobs back.
            let job = parse_id(&record.job_id.0)?;
            if let Some(job) = state.jobs.get_mut(&job).filter(|j| j.status == Status::Failed) {
                job.job.order_key = None;
            }
            drop(state);
            self.work.notify_waiters();
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        let horizon = Utc::now() - age;
        let mut state = self.lock();
        let purged: Vec<FailureRecord> = {
            let old: Vec<u64> =
                state.records.iter().filter(|(_, r)| r.last_failed_at < horizon).map(|(n, _)| *n).collect();
            old.iter().filter_map(|n| state.records.remove(n)).collect()
        };
        // A failed job goes with its last record, payload, key and ledger entry: the key is free
        // again. A job with a newer record (failed again after a replay) stays for it.
        for record in &purged {
            let Ok(id) = parse_id(&record.job_id.0) else { continue };
            let recorded = state.records.values().any(|r| r.job_id == record.job_id);
            if !recorded && state.jobs.get(&id).is_some_and(|j| j.status == Status::Failed) {
                let job = state.jobs.remove(&id).expect("looked up above");
                state.by_key.remove(&job.job.key);
                state.ledger.remove(&job.job.key);
            }
        }
        drop(state);
        // A purged failed job may have held its order key's next job back.
        self.work.notify_waiters();
        Ok(purged.len() as u64)
    }

    async fn blocked(&self) -> Result<Vec<Blocked>> {
        let state = self.lock();
        let mut blocked = Vec::new();
        for (n, record) in state.records.iter().filter(|(_, r)| r.state.is_open()) {
            let Ok(id) = parse_id(&record.job_id.0) else { continue };
            let Some(order) =
                state.jobs.get(&id).filter(|j| j.status == Status::Failed).and_then(|j| j.job.order_key.clone())
            else {
                continue;
            };
            let waiting = state
                .jobs
                .range(id + 1..)
                .filter(|(_, j)| j.status != Status::Done && j.job.order_key.as_ref() == Some(&order))
                .count() as u64;
            let (kind, key) = (record.kind.clone(), record.key.clone());
            blocked.push(Blocked { order_key: order, record: FailureId(n.to_string()), kind, key, waiting });
        }
        Ok(blocked)
    }
}

impl Replay for MemoryBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        self.replay_with(id, None, reason, actor)
    }

    async fn replay_amended(
        &self,
        id: &FailureId,
        payload: &Value,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        require_audit("an amended replay's reason", reason)?;
        require_audit("an amended replay's actor", actor)?;
        self.replay_with(id, Some(payload), reason, actor)
    }
}

impl MemoryBackend {
    fn replay_with(&self, id: &FailureId, amended: Option<&Value>, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        let n = parse_id(&id.0)?;
        let mut state = self.lock();
        let record =
            state.records.get(&n).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state.clone()));
        }
        let (job_id, key) = (record.job_id.clone(), record.key.clone());
        if let Some(payload) = amended {
            let job = NewJob::new(record.kind.clone(), key.clone(), payload.clone())?;
            job.check_size(self.max_payload)?;
            if state.ledger.get(&key).is_some_and(|e| matches!(e.state, Effect::Done { .. })) {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("record {id}: the effect of key {key} has happened; an amended replay would repeat it"),
                ));
            }
        }
        // Reset the existing job: a fresh enqueue with the same key would only find a duplicate.
        let job = state
            .jobs
            .get_mut(&parse_id(&job_id.0)?)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "the record's job is gone"))?;
        job.attempts = 0;
        job.errors.clear();
        // A person asked for it to run: its deadline, if it had one, no longer applies.
        job.job.deadline = None;
        job.cancelled = None;
        job.status = Status::Queued { ready_at: Instant::now() };
        if let Some(payload) = amended {
            // The key's fingerprint follows: the amended job is the key's job now.
            job.job.payload = payload.clone();
            job.fingerprint = payload_fingerprint(payload);
            state.ledger.remove(&key);
        }
        let record = state.records.get_mut(&n).expect("looked up above");
        record.state = RecordState::replaying(reason, actor, amended.is_some());
        record.amended = amended.cloned();
        drop(state);
        self.work.notify_waiters();
        Ok(ReplayOutcome::Replayed(job_id))
    }
}

impl crate::backend::Forget for MemoryBackend {
    async fn forget_key(&self, key: &IdempotencyKey) -> Result<crate::backend::Forgotten> {
        let mut state = self.lock();
        let mut forgotten = crate::backend::Forgotten::default();
        if let Some(&id) = state.by_key.get(key) {
            if matches!(state.jobs[&id].status, Status::Running { .. }) {
                return Err(Error::temporary(format!("a job of key {key} is running; forget it once it settles")));
            }
            state.jobs.remove(&id);
            state.by_key.remove(key);
            forgotten.jobs = 1;
        }
        let records: Vec<u64> = state.records.iter().filter(|(_, r)| &r.key == key).map(|(n, _)| *n).collect();
        for n in &records {
            state.records.remove(n);
        }
        forgotten.records = records.len() as u64;
        // The key's entry, and its records' alert marks (`redrive_alert:record=<id>:…`).
        let marks: Vec<String> = records.iter().map(|n| format!("redrive_alert:record={n}:")).collect();
        let before = state.ledger.len();
        state.ledger.retain(|k, _| k != key && !marks.iter().any(|m| k.as_str().starts_with(m.as_str())));
        forgotten.ledger = (before - state.ledger.len()) as u64;
        drop(state);
        // A forgotten failed job may have held its order key's next job back.
        self.work.notify_waiters();
        Ok(forgotten)
    }
}
