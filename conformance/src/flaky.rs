//! A record store that fails on demand, for testing what a broker backend does while its
//! database is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redrive_core::alert::BoxFuture;
use redrive_core::kit::{RecordStore, Taken};
use redrive_core::{Error, FailureId, FailureQuery, FailureRecord, RecordState, Result};

/// Wraps a [`RecordStore`]: its writes of new records fail while [`set_down`](Self::set_down)
/// says so, as a database outage would; every other call goes through. Clones share the switch.
#[derive(Clone)]
pub struct FlakyStore<S> {
    store: S,
    down: Arc<AtomicBool>,
}

impl<S: RecordStore + Clone> FlakyStore<S> {
    /// `store`, up.
    pub fn new(store: S) -> Self {
        Self { store, down: Arc::default() }
    }

    /// Takes the store down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }
}

impl<S: RecordStore> RecordStore for FlakyStore<S> {
    fn keep_records<'a>(&'a self, queue: &'a str, records: &'a [FailureRecord]) -> BoxFuture<'a, Result<u64>> {
        if self.down.load(Ordering::Relaxed) {
            return Box::pin(async { Err(Error::temporary("the database is down")) });
        }
        self.store.keep_records(queue, records)
    }
    fn records<'a>(&'a self, queue: &'a str, query: &'a FailureQuery) -> BoxFuture<'a, Result<Vec<FailureRecord>>> {
        self.store.records(queue, query)
    }
    fn record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<FailureRecord>> {
        self.store.record(queue, id)
    }
    fn confirm_record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<bool>> {
        self.store.confirm_record(queue, id)
    }
    fn discard_replaying<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        discarded: &'a RecordState,
    ) -> BoxFuture<'a, Result<bool>> {
        self.store.discard_replaying(queue, id, discarded)
    }
    fn open_records<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64>> {
        self.store.open_records(queue)
    }
    fn take_for_replay<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken>> {
        self.store.take_for_replay(queue, id, window)
    }
    fn close_record<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        state: &'a RecordState,
    ) -> BoxFuture<'a, Result<Option<RecordState>>> {
        self.store.close_record(queue, id, state)
    }
    fn purge_records<'a>(&'a self, queue: &'a str, age: Duration) -> BoxFuture<'a, Result<u64>> {
        self.store.purge_records(queue, age)
    }
    fn records_mention<'a>(&'a self, queue: &'a str, text: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.store.records_mention(queue, text)
    }
}
