//! Where a broker backend keeps its failure records.
//!
//! A broker (SQS, Azure Queue Storage) cannot be read like a table: its dead-letter queue is
//! read by receiving messages, which hides them from other readers, samples rather than lists,
//! and gives no state to a replay in flight. A [`RecordStore`] (your database, such as
//! `redrive-postgres`) keeps the records instead: complete, paged reads for any number of
//! readers, and a replay that one process takes at a time. The broker's dead-letter queue stays
//! the intake for what its redrive policy moved, drained into the store.
//!
//! Object-safe, because a broker backend holds one as `Arc<dyn RecordStore>`; records are rare,
//! so the boxed futures cost nothing that matters.

use std::time::Duration;

use crate::alert::BoxFuture;
use crate::backend::{FailureId, FailureQuery, FailureRecord, RecordState};
use crate::error::Result;

/// What [`RecordStore::take_for_replay`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Taken {
    /// The record was open (or its last replay lapsed unconfirmed): it is this caller's to send
    /// back, for the window asked.
    Record(Box<FailureRecord>),
    /// The record is closed, or another caller is replaying it: send nothing.
    Closed(RecordState),
}

/// Failure records of broker queues, scoped by queue (one store serves many).
///
/// A record is open, being replayed, replayed or discarded. A replay takes the record for a
/// window; a record taken and never closed (its replayer died) reads as open again once the
/// window lapses, so nothing is left behind, and is then sent again (the effect ledger keeps
/// the effect to one).
pub trait RecordStore: Send + Sync + 'static {
    /// Keeps `records` (each open) unless a record with the same id is kept; returns how many
    /// were new. Idempotent: a worker or a drain that retries writes nothing twice. A new record
    /// that names the record it replays ([`FailureRecord::replay_of`]) settles that one as
    /// [`RecordState::FailedAgain`], naming it, in the same write.
    fn keep_records<'a>(&'a self, queue: &'a str, records: &'a [FailureRecord]) -> BoxFuture<'a, Result<u64>>;

    /// Records matching `query`, oldest first, one page (see [`FailureQuery::after`]).
    fn records<'a>(&'a self, queue: &'a str, query: &'a FailureQuery) -> BoxFuture<'a, Result<Vec<FailureRecord>>>;

    /// One record; [`NotFound`](crate::ErrorKind::NotFound) if there is none.
    fn record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<FailureRecord>>;

    /// How many records are open.
    fn open_records<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64>>;

    /// Takes an open record for a replay, for `window`: until it lapses, every other caller
    /// finds the record closed as replayed (with no actor or reason yet: the replay's
    /// [`close_record`](Self::close_record) writes them).
    fn take_for_replay<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken>>;

    /// Closes a record as `state` (replayed or discarded, each kept whole, actor and reason
    /// included): from open, or, for a replay, from taken. Returns the state it had if it was closed already, and then changes nothing.
    fn close_record<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        state: &'a RecordState,
    ) -> BoxFuture<'a, Result<Option<RecordState>>>;

    /// Settles a replaying record: `state` is what its replayed job came to
    /// ([`RecordState::Confirmed`], built from the record's replaying state). A record that is
    /// not replaying is left as it is; one still taken by its replay (the job ran before the
    /// replay closed it) is settled, and the replay's close then adds its actor and reason.
    /// Returns whether it changed.
    fn confirm_record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<bool>>;

    /// Closes a replaying record (or one still taken by its replay) as `discarded`, a
    /// [`RecordState::Discarded`]: its replayed job was cancelled and will never settle it. A
    /// record in any other state is left as it is. Returns whether it changed.
    fn discard_replaying<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        discarded: &'a RecordState,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Deletes records (any state) whose last failure is older than `age`, payloads included;
    /// returns how many.
    fn purge_records<'a>(&'a self, queue: &'a str, age: Duration) -> BoxFuture<'a, Result<u64>>;

    /// Whether `text` appears in any record of `queue` (a test aid: a purge forgets payloads).
    #[doc(hidden)]
    fn records_mention<'a>(&'a self, queue: &'a str, text: &'a str) -> BoxFuture<'a, Result<bool>>;
}
