//! The broker kit: what message-queue backends (SQS, Azure Queue Storage, QStash) share.
//!
//! A broker backend keeps its failure records in a [`RecordStore`] (the application's
//! database); its dead-letter or poison queue is the intake, drained into the store before
//! records are read. A backend holds a [`BrokerCore`] and implements [`Broker`], a handful of
//! calls on that queue and one send, and gets [`DeadLetter`](crate::DeadLetter) and
//! [`Replay`](crate::Replay) from here, with the same guarantees everywhere: complete, paged
//! reads that hide nothing from other readers, and a replay that one process sends at a time.
//!
//! Beside them are the parts every broker's claim path uses:
//! - [`Held`]: the table of the messages this process holds, fenced by their lease tokens;
//! - [`Parked`]: a push service's requests held open until a worker's verdict answers them;
//! - the conversions between what a message carries and what the worker and the store see
//!   ([`Envelope::into_job`](crate::kit::Envelope::into_job), [`FailureRecord::from_job`],
//!   [`carried_job`] for a body that is not an envelope);
//! - the rules every broker's messages follow: an error history of bounded size
//!   ([`add_error`]), text cleaned of what a broker refuses ([`clean`], [`last_error`]).
//!
//! `docs/new-backend.md` walks through writing a broker backend with them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use crate::backend::{FailureId, FailureRecord, RecordState, ReplayOutcome};
use crate::error::{Error, ErrorKind, Result, Retry};
use crate::job::{JobId, JobRecord, NewJob};
use crate::records::RecordStore;

mod convert;
mod dead_letters;
mod drain;
mod held;
mod history;
mod jobs;
mod parked;

pub use self::convert::{Known, carried_job, dead_record};
pub use self::dead_letters::{REPLAY_WINDOW, confirm_replay, withdraw_replay};
pub use self::drain::drain;
pub use self::held::{HELD_FOR, HELD_MAX, Held, TOKENS_KEPT};
pub use self::history::{HISTORY, HISTORY_ERROR_LEN, HISTORY_ROOM, MAX_ERROR_LEN, add_error, clean, cut, last_error};
pub use self::parked::{Call, Lapse, Parked, Slot};

/// A message taken from the dead-letter queue by a drain, as the record it holds.
#[derive(Debug)]
pub struct Drained {
    /// The record: the worker's (written there while the store was down) or one made of a
    /// message the broker or another tool moved there.
    pub record: FailureRecord,
    /// What deletes the message, or shows it again: a receipt handle, a message id and pop
    /// receipt. Never logged.
    pub receipt: String,
}

/// What the kit keeps for every broker, held by the backend and lent through [`Broker::core`]:
/// where the failure records are, the queue's name there, and one drain at a time.
pub struct BrokerCore {
    records: Arc<dyn RecordStore>,
    scope: String,
    draining: tokio::sync::Mutex<()>,
    #[cfg(feature = "test-hooks")]
    stop_after_replay_send: std::sync::atomic::AtomicBool,
}

impl BrokerCore {
    /// The core of a broker whose records `records` keeps under `scope`: the queue's name in the
    /// store, unique across the brokers that share it (an ARN, an endpoint and a queue name).
    pub fn new(records: Arc<dyn RecordStore>, scope: impl Into<String>) -> Self {
        Self {
            records,
            scope: scope.into(),
            draining: tokio::sync::Mutex::new(()),
            #[cfg(feature = "test-hooks")]
            stop_after_replay_send: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The store that keeps this queue's failure records.
    pub fn records(&self) -> &dyn RecordStore {
        &*self.records
    }

    /// This queue's name in the store.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Keeps a record the worker wrote, once by its id.
    pub async fn keep(&self, record: &FailureRecord) -> Result<u64> {
        self.records.keep_records(&self.scope, std::slice::from_ref(record)).await
    }

    /// Refuses a store that cannot serve this queue (not migrated, unreachable), at start-up.
    pub async fn check_store(&self) -> Result<()> {
        self.records.open_records(&self.scope).await.map_err(|e| {
            Error::new(e.kind(), format!("the failure record store is not ready (has it been migrated?): {e}"))
        })?;
        Ok(())
    }

    /// A test aid: replays stop between their send and closing the record, as a crash would.
    #[cfg(feature = "test-hooks")]
    pub fn stop_replays_after_send(&self, stop: bool) {
        self.stop_after_replay_send.store(stop, std::sync::atomic::Ordering::Relaxed);
    }

    fn replay_stops_after_send(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.stop_after_replay_send.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(feature = "test-hooks"))]
        false
    }
}

impl std::fmt::Debug for BrokerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerCore").field("scope", &self.scope).finish_non_exhaustive()
    }
}

/// A broker queue with a dead-letter queue and a [`RecordStore`]: what
/// [`DeadLetter`](crate::DeadLetter) and [`Replay`](crate::Replay) need of it. Implement it and
/// both come with it.
pub trait Broker: Send + Sync {
    /// The kit's state this broker holds: its record store and scope, its drain lock.
    fn core(&self) -> &BrokerCore;

    /// One page of the dead-letter queue, hidden from other drains for `hide`; empty when the
    /// queue is. Asks every server of the broker, so that an empty page means an empty queue.
    fn receive_dead(&self, hide: Duration) -> impl Future<Output = Result<Vec<Drained>>> + Send;

    /// Deletes drained messages, now kept in the store.
    fn delete_dead(&self, drained: &[Drained]) -> impl Future<Output = Result<()>> + Send;

    /// Shows drained messages again at once (the store refused them): the next read takes them.
    fn show_dead_again(&self, drained: &[Drained]) -> impl Future<Output = ()> + Send;

    /// Refuses a job this queue cannot carry (too large, a cap over the broker's), before any
    /// record changes.
    fn check_job(&self, job: &NewJob) -> Result<()>;

    /// Sends a replayed job to the source queue with its original keys.
    fn send_replay(&self, job: &NewJob, record: &FailureId) -> impl Future<Output = Result<JobId>> + Send;

    /// Replays record `record` in one step, where the queue and the record store share one
    /// database: takes the record, sends `job` and closes the record as `closed` in one
    /// transaction, so that no failure between them leaves a job sent and its record open (or
    /// taken until a window lapses). `Ok(None)` by default: the kit takes, sends and closes in
    /// three steps, each its own write.
    fn replay_at_once(
        &self,
        _job: &NewJob,
        _record: &FailureId,
        _closed: &RecordState,
    ) -> impl Future<Output = Result<Option<ReplayOutcome>>> + Send {
        async { Ok(None) }
    }

    /// Removes a closed record's message from the dead-letter queue, where a drain leaves it
    /// (QStash: the entry stays while the record is open, for its retry API). Nothing by default:
    /// a drain deletes what it keeps.
    fn forget_dead(&self, _record: &FailureId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Deletes from the dead-letter queue what a purge of records older than `age` removes, before
    /// the store forgets them (else a drain would keep them again). Nothing by default.
    fn purge_dead(&self, _age: Duration) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
}

/// A batch enqueue that stopped part-way on `broker`: how many jobs were sent and which keys
/// were not (`sent[i]` is whether `jobs[i]` was), for the caller to enqueue only those again;
/// with the kind and retry flag of the failure that stopped it.
pub fn not_all_sent(broker: &str, jobs: &[NewJob], sent: &[bool], why: &str, cause: (ErrorKind, Retry)) -> Error {
    let unsent: Vec<&str> = jobs.iter().zip(sent).filter(|(_, s)| !**s).map(|(j, _)| j.key.as_str()).collect();
    let shown = unsent.iter().take(20).copied().collect::<Vec<_>>().join(", ");
    let more = if unsent.len() > 20 { format!(" and {} more", unsent.len() - 20) } else { String::new() };
    let message = format!(
        "{broker}: {} of {} jobs were sent; not sent ({why}): {shown}{more}; enqueue only these again",
        jobs.len() - unsent.len(),
        jobs.len()
    );
    Error::new(cause.0, message).with_retry(cause.1)
}

/// Logs that a record could not be kept in the store and goes to the broker's dead-letter queue.
pub fn store_down(job: &JobRecord, error: &Error) {
    warn!(job = %job.id, kind = %job.kind, key = %job.key, attempt = job.attempt, error = %error,
        "the failure record store failed; the record goes to the dead-letter queue, to be drained later");
}
