//! redrive-core: the contracts, the key and attempt logic, the worker and the in-memory backend
//! of [redrive](https://docs.rs/redrive).
//!
//! # Two faces
//!
//! Core is read by two people, and shows each one face.
//!
//! **An application** enqueues jobs, runs a worker and looks after failure records. Its items are
//! at the crate root, and [`prelude`] gathers the ones nearly every application names:
//!
//! ```
//! use redrive_core::prelude::*;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct SendReceipt {
//!     order: u64,
//! }
//!
//! impl Job for SendReceipt {
//!     const KIND: &'static str = "send_receipt";
//!     fn key(&self, key: KeyBuilder) -> KeyBuilder {
//!         key.fact("order", self.order)
//!     }
//! }
//!
//! # async fn run() -> Result<()> {
//! let backend = MemoryBackend::new();
//! backend.enqueue_job(&SendReceipt { order: 42 }).await?;
//! let worker = Worker::builder(backend.clone(), backend)
//!     .handle::<SendReceipt>(|job: SendReceipt, ctx: JobContext| async move {
//!         let _ = (job.order, ctx.provider_key);
//!         Ok::<_, JobError>(())
//!     })
//!     .build()
//!     .start();
//! worker.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! - [`IdempotencyKey`]: one stable ID per intended effect, from business facts.
//! - [`Job`]: a typed job declares its kind, its key, its cap and severity.
//! - [`Enqueue`], [`DeadLetter`], [`Replay`], [`QueueStats`] and their conveniences
//!   [`EnqueueExt`], [`ReplayExt`], [`QueueStatsExt`]: what an application calls on a backend.
//! - [`Worker`]: claim → decode → ledger check → handler → complete, retry or failure record.
//! - [`AlertSink`]: where the worker announces a failure record.
//! - [`Error`]: one error type, with an [`ErrorKind`] and a [`Retry`] flag.
//! - [`MemoryBackend`]: every contract in memory, the reference and the embedded default.
//!
//! **A backend author** implements the contracts (contract v2; see `docs/ARCHITECTURE.md` and
//! `docs/new-backend.md`). What only they need is in [`kit`]: [`kit::Backend`] and the
//! [`kit::Capabilities`] it declares, [`kit::Claim`] with its [`kit::Lease`]s and
//! [`kit::Kinds`], [`kit::Renew`], the effect ledger ([`kit::Ledger`], [`kit::Hold`],
//! [`kit::Begin`]), and for a message-queue backend the broker kit ([`kit::broker`]) with its
//! [`kit::RecordStore`] and wire [`kit::Envelope`]. The conformance suite (`redrive-conformance`)
//! holds a backend to every promise its capabilities make.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod alert;
mod backend;
mod decode;
pub mod doctor;
mod envelope;
pub mod error;
pub mod job;
pub mod key;
pub mod memory;
pub mod policy;
mod records;
mod redact;
mod trace;
pub mod worker;

#[cfg(feature = "webhook")]
pub use alert::WebhookAlerts;
pub use alert::{Alert, AlertSink, AlertSinkExt, BoxFuture, PauseAlert, TracingAlerts};
pub use backend::{
    BREAKER, Blocked, CancelOutcome, Cancellation, Counts, DeadLetter, Enqueue, EnqueueExt, Enqueued, FailureId,
    FailureQuery, FailureRecord, Flow, FlowAction, FlowEvent, Forget, Forgotten, JobQuery, JobState, Jobs, JobsExt,
    KindFlow, Limits, LiveJob, Paused, QueueStats, QueueStatsExt, Rate, RecordState, Replay, ReplayExt, ReplayOutcome,
    Running,
};
pub use error::{Error, ErrorKind, Result, Retry};
pub use job::{
    DEFAULT_CAP, Job, JobContext, JobError, JobId, JobRecord, MAX_ORDER_KEY, NewJob, PRIORITIES, Retrying, Severity,
};
pub use key::{IdempotencyKey, KeyBuilder, ProviderKey};
pub use memory::MemoryBackend;
pub use policy::{Backoff, DEFAULT_MAX_NOT_NOW, Decision, Outcome, RetryPolicy};
pub use worker::{Breaker, Handler, RunningWorker, Worker, WorkerBuilder, WorkerConfig, WorkerStats, stop_signal};

/// What an application imports: `use redrive_core::prelude::*;`.
///
/// Jobs and their keys, the worker, the calls an application makes on a backend (the traits
/// whose methods it calls, with their conveniences), errors, and the in-memory backend. Nothing a
/// backend author alone needs: that is [`kit`].
pub mod prelude {
    pub use crate::alert::{Alert, AlertSink};
    pub use crate::backend::{
        DeadLetter, Enqueue, EnqueueExt, Enqueued, FailureId, FailureQuery, FailureRecord, QueueStats, QueueStatsExt,
        RecordState, Replay, ReplayExt, ReplayOutcome,
    };
    pub use crate::error::{Error, ErrorKind, Result};
    pub use crate::job::{Job, JobContext, JobError, JobId, NewJob, Severity};
    pub use crate::key::{IdempotencyKey, KeyBuilder, ProviderKey};
    pub use crate::memory::MemoryBackend;
    pub use crate::worker::{RunningWorker, Worker, WorkerConfig};
}

pub mod kit;
