//! redrive-core: the contracts, the key and attempt logic, the worker and the in-memory backend
//! of [redrive](https://docs.rs/redrive).
//!
//! - [`IdempotencyKey`]: one stable ID per intended effect, from business facts.
//! - [`Job`]: a typed job declares its kind, its key, its cap and severity.
//! - [`Backend`], [`Enqueue`], [`Claim`], [`Renew`], [`DeadLetter`], [`Replay`], [`Ledger`]: what a
//!   backend implements (contract v2; see `docs/ARCHITECTURE.md`).
//! - [`RecordStore`]: where a broker backend (SQS, Azure) keeps its failure records; [`broker`]:
//!   what broker backends share, [`DeadLetter`] and [`Replay`] included.
//! - [`Worker`]: claim → decode → ledger check → handler → complete, retry or failure record.
//! - [`MemoryBackend`]: every contract in memory, the reference and the embedded default.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod alert;
pub mod backend;
pub mod broker;
mod decode;
pub mod envelope;
pub mod error;
pub mod job;
pub mod key;
pub mod memory;
pub mod policy;
pub mod records;
mod redact;
pub mod worker;

#[cfg(feature = "webhook")]
pub use alert::WebhookAlerts;
pub use alert::{Alert, AlertSink, AlertSinkExt, BoxFuture, TracingAlerts};
pub use backend::{
    AttemptError, Backend, Begin, Capabilities, Claim, Claimed, Counts, DeadLetter, Dedupe, Enqueue, EnqueueExt,
    Enqueued, FailureId, FailureQuery, FailureRecord, Hold, Kinds, Lease, Ledger, NoRenewal, QueueStats, QueueStatsExt,
    RecordState, Renew, Replay, ReplayExt, ReplayOutcome, require_audit,
};
pub use envelope::Envelope;
pub use error::{Error, ErrorKind, Result, Retry};
pub use job::{DEFAULT_CAP, Job, JobContext, JobError, JobId, JobRecord, NewJob, Severity, payload_fingerprint};
pub use key::{IdempotencyKey, KeyBuilder, ProviderKey};
pub use memory::MemoryBackend;
pub use policy::{Backoff, Decision, Outcome, RetryPolicy};
pub use records::{RecordStore, Taken};
pub use worker::{Handler, RunningWorker, Worker, WorkerBuilder, WorkerConfig, WorkerStats, stop_signal};
