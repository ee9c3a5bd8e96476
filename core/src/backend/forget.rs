//! Forgetting a key entirely: what a tool that made keys of its own (`redrive verify`) or a
//! person erasing a customer's data needs, where purge forgets by age.

use std::future::Future;

use serde::Serialize;

use crate::error::Result;
use crate::key::IdempotencyKey;

/// What [`Forget::forget_key`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Forgotten {
    /// The key's job rows.
    pub jobs: u64,
    /// Its failure records, a broker's kept in this store included.
    pub records: u64,
    /// Ledger entries: the key's own, its same-database effect, and its records' alert marks.
    pub ledger: u64,
}

impl Forgotten {
    /// Whether nothing of the key was kept.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A store that can forget one key entirely: its job (whatever its state), its failure records
/// (open or closed) with their alert marks, its effect ledger entry. As
/// [`DeadLetter::purge`](super::DeadLetter::purge) forgets an old record, but by key: afterwards
/// the payload is nowhere in the store and the key is free (enqueued again, it makes a new job
/// and runs). A job of the key that is running is not forgotten: the call answers
/// a temporary error ([`Retry::Temporary`](crate::Retry::Temporary)) and changes nothing (its worker would write its
/// settlement to nothing; try again once it settles). A broker's messages are not reached: a
/// message of the key still queued would run again, and QStash's DLQ keeps a copy of each
/// record until a purge (its backend's `forget_dlq_entries` deletes them: call it first).
pub trait Forget: Send + Sync {
    /// Forgets `key`; an unknown key forgets nothing (`Forgotten::is_empty`).
    fn forget_key(&self, key: &IdempotencyKey) -> impl Future<Output = Result<Forgotten>> + Send;
}
