//! [`Enqueue`]: adding jobs, and its typed conveniences.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Backend;
use crate::error::Result;
use crate::job::{Job, JobId, NewJob};
use crate::key::ProviderKey;

/// What [`Enqueue::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// A new job; its provider key is the one the enqueued job was minted with.
    Created(JobId),
    /// A job with this key and payload already exists (or is within the dedupe window), a
    /// cancelled one included (see [`Jobs::cancel_job`](super::Jobs::cancel_job)); the job just
    /// offered was dropped, its provider key with it.
    Duplicate {
        /// The existing job.
        id: JobId,
        /// The provider key stored with the existing job: the one a provider will see, not the
        /// one the dropped job was minted with. `None` where the backend cannot tell.
        provider_key: Option<ProviderKey>,
    },
    /// The key's job ran out of attempts (or failed for good) and its failure record is kept,
    /// open or discarded: nothing was enqueued and nothing will run. Replay the record to run it
    /// again; once the record is purged, the key is free and an enqueue creates a new job.
    Failed {
        /// The failed job.
        id: JobId,
    },
}

impl Enqueued {
    /// The job's id, new or existing.
    pub fn id(&self) -> &JobId {
        match self {
            Self::Created(id) | Self::Duplicate { id, .. } | Self::Failed { id } => id,
        }
    }

    /// Whether this call created the job.
    pub fn is_created(&self) -> bool {
        matches!(self, Self::Created(_))
    }
}

/// Adds jobs.
pub trait Enqueue: Backend {
    /// Adds one job. Errors: [`KeyConflict`](crate::ErrorKind::KeyConflict) for the same key
    /// with a different payload (where the backend can see it at enqueue),
    /// [`PayloadTooLarge`](crate::ErrorKind::PayloadTooLarge) before anything is sent.
    fn enqueue(&self, job: NewJob) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Adds many jobs, in order; one answer per job. A backend sends them in as few calls as
    /// it can; the whole batch is refused if any payload is too large.
    fn enqueue_batch(&self, jobs: Vec<NewJob>) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
}

/// Typed conveniences over [`Enqueue`].
pub trait EnqueueExt: Enqueue {
    /// Enqueues a typed job: derives its key from its fields, mints its provider key.
    fn enqueue_job<J: Job + Sync>(&self, job: &J) -> impl Future<Output = Result<Enqueued>> + Send {
        let new = NewJob::from_job(job);
        async move { self.enqueue(new?).await }
    }

    /// Enqueues `job` to run no earlier than `at`.
    fn enqueue_at(&self, job: NewJob, at: DateTime<Utc>) -> impl Future<Output = Result<Enqueued>> + Send {
        self.enqueue(job.run_at(at))
    }

    /// Enqueues `job` to run no earlier than `delay` from now.
    fn enqueue_in(&self, job: NewJob, delay: Duration) -> impl Future<Output = Result<Enqueued>> + Send {
        self.enqueue(job.run_in(delay))
    }
}

impl<T: Enqueue + ?Sized> EnqueueExt for T {}
