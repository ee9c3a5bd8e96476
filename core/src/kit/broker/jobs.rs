//! [`Jobs`] for every [`Broker`]: refused. A broker holds its messages unlisted, and cannot take
//! one out by id; its counts are [`QueueStats`](crate::QueueStats), and its failure records are
//! listed as ever.

use super::Broker;
use crate::backend::{CancelOutcome, JobQuery, Jobs, LiveJob};
use crate::error::{Error, ErrorKind, Result};
use crate::job::JobId;

fn unsupported(what: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("a broker queue cannot {what}: it holds its messages unlisted (its counts are what it can show)"),
    )
}

impl<B: Broker> Jobs for B {
    async fn list_jobs(&self, _query: &JobQuery) -> Result<Vec<LiveJob>> {
        Err(unsupported("list its jobs"))
    }

    async fn get_job(&self, _id: &JobId) -> Result<LiveJob> {
        Err(unsupported("show a job"))
    }

    async fn cancel_job(&self, _id: &JobId, _reason: &str, _actor: &str) -> Result<CancelOutcome> {
        Err(unsupported(
            "cancel a job by id (cancel its key instead: `Ledger::cancel_effect`, or `redrive jobs cancel --key`, marks \
             it in the workers' ledger)",
        ))
    }
}
