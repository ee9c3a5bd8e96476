//! `Broker` on Inngest. Inngest keeps no dead-letter queue to drain: a run that fails sends
//! `inngest/function.failed`, which the queue's failure handler (the same endpoint) turns into a
//! record in the store. A replay sends the record's job as a new event, under an id of its own.

use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::AttemptError;
use redrive_core::kit::broker::{Broker, BrokerCore, Drained, Known, carried_job, dead_record};
use redrive_core::{Error, ErrorKind, FailureId, JobId, NewJob, Result};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::InngestBackend;

impl InngestBackend {
    /// Keeps the record of a run that failed, from its `inngest/function.failed` event: a run
    /// the worker failed already has its record (the same id, the run's: kept once); one that
    /// Inngest failed on its own (its calls again spent, each unanswered) gets one here, with the
    /// original event's job, Inngest's error and the run's id. Another function's event is left.
    pub(crate) async fn keep_failed_run(&self, failed: &Value) -> Result<()> {
        let data = &failed["data"];
        if data["function_id"].as_str() != Some(self.inner.config.function_id().as_str()) {
            return Ok(());
        }
        let Some(run_id) = data["run_id"].as_str() else {
            warn!("an inngest/function.failed event without a run id was left");
            return Ok(());
        };
        let event = &data["event"];
        // A continued run's event carries the job's first id and the runs before it.
        let (body, carried) = crate::steps::split_carried(&event["data"]);
        let before = crate::steps::Progress::read(&serde_json::Map::new(), carried.as_ref());
        let event_id = crate::steps::job_id(event, carried.as_ref()).unwrap_or(run_id).to_owned();
        let (env, undecodable) = carried_job("inngest", &event_id, &body, Known::default(), Utc::now());
        let error = match &data["error"] {
            Value::String(s) => s.clone(),
            error => error["message"].as_str().map_or_else(|| error.to_string(), str::to_owned),
        };
        let error = redrive_core::kit::broker::last_error(&format!("Inngest failed the run: {error}"));
        // Inngest's calls again since the run's last mark are not in the event: at most the cap.
        let attempts = (before.spent + self.inner.config.retries + 1).min(env.cap.max(1));
        let mut errors = before.errors;
        errors.push(AttemptError { attempt: attempts, at: Utc::now(), error: error.clone() });
        let mut record =
            dead_record((FailureId(run_id.to_owned()), JobId(event_id)), env, error, errors, attempts, Utc::now());
        if let Some(why) = undecodable {
            record.last_error = redrive_core::kit::broker::last_error(&format!("{}; {why}", record.last_error));
        }
        if self.inner.core.keep(&record).await? > 0 {
            info!(record = %record.id, kind = %record.kind, key = %record.key, "a run Inngest failed is kept as a record");
        }
        Ok(())
    }

    /// A replayed job's event id: the job's, and the record's. Not the job's alone (Inngest
    /// would drop it within its 24 hours), and one replay of the record sends one run however
    /// often it is tried.
    fn replay_id(&self, job: &NewJob, record: &FailureId) -> String {
        redrive_core::kit::payload_fingerprint(&json!([self.event_id(job), record.0]))
    }
}

impl Broker for InngestBackend {
    fn core(&self) -> &BrokerCore {
        &self.inner.core
    }

    /// Nothing to drain: failed runs reach the store through the failure handler.
    async fn receive_dead(&self, _hide: Duration) -> Result<Vec<Drained>> {
        Ok(Vec::new())
    }

    async fn delete_dead(&self, _drained: &[Drained]) -> Result<()> {
        Ok(())
    }

    async fn show_dead_again(&self, _drained: &[Drained]) {}

    fn check_job(&self, job: &NewJob) -> Result<()> {
        job.check_fits(&<Self as redrive_core::kit::Backend>::capabilities(self))?;
        if job.cap == 0 {
            return Err(Error::new(ErrorKind::Config, "Inngest: a job needs at least one attempt"));
        }
        Ok(())
    }

    async fn send_replay(&self, job: &NewJob, record: &FailureId) -> Result<JobId> {
        let id = self.replay_id(job, record);
        self.send(std::slice::from_ref(job), vec![id.clone()]).await?;
        Ok(JobId(id))
    }
}
