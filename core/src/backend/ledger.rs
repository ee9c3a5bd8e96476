//! [`Ledger`]: the effect ledger, what makes an effect happen once.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use super::flow::{Flow, NoFlow};
use super::{CancelOutcome, Cancellation, Lease};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{IdempotencyKey, ProviderKey};
use crate::redact::debug_redacted;

/// A key held by one attempt in the effect ledger.
#[derive(Clone, PartialEq, Eq)]
pub struct Hold {
    /// The key.
    pub key: IdempotencyKey,
    /// This attempt's token; a hold taken over by a later attempt no longer matches.
    pub token: String,
    /// The key's provider key: minted with the first job that began the key, and the same for
    /// every later attempt and every later message of the key.
    pub provider_key: ProviderKey,
    /// Set where the hold is the job's own lease ([`Claimed::begun`](super::Claimed::begun)): the hold is kept by
    /// renewing the lease, and ends when the job is settled.
    pub lease: Option<Lease>,
}

/// What [`Ledger::begin`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// No attempt has started this effect: go ahead.
    Fresh(Hold),
    /// An earlier attempt started the effect and did not finish; it may have reached the
    /// provider. Go ahead with the provider key.
    Resumed(Hold),
    /// Another attempt holds the key right now: try again after this long.
    Busy(Duration),
    /// The effect happened; here is its stored result. Skip.
    Done(Value),
    /// A person cancelled the key ([`Ledger::cancel_effect`]): the effect shall not happen. Complete
    /// the job unrun.
    Cancelled(Cancellation),
}

/// The effect ledger (processed keys): what makes an effect happen once, whatever the queue
/// delivers. Key first: `begin` marks the key pending before the outside call, `finish` marks it
/// done after.
pub trait Ledger: Send + Sync {
    /// Starts an attempt at the effect of `key`, holding it for `hold`. The payload's
    /// [fingerprint](crate::kit::payload_fingerprint) is stored with the key; a later begin with
    /// another payload is a [`KeyConflict`](crate::ErrorKind::KeyConflict). `provider_key` is
    /// stored if the key is new; the hold carries the stored one.
    fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> impl Future<Output = Result<Begin>> + Send;

    /// Keeps holding the key for `by` from now.
    fn extend_hold(&self, hold: &Hold, by: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Lets go of the key without finishing: it stays pending, and the next attempt resumes.
    fn release_hold(&self, hold: &Hold) -> impl Future<Output = Result<()>> + Send;

    /// Marks the effect done with its result. Idempotent. A key cancelled while this hold ran
    /// is marked done all the same: the effect happened, and completion wins.
    fn finish(&self, hold: &Hold, result: &Value) -> impl Future<Output = Result<()>> + Send;

    /// Cancels the effect of `key`, keeping why and who: the cancel a broker's jobs get, whose
    /// messages cannot be listed or taken out by id. From now on [`begin`](Self::begin) answers
    /// [`Begin::Cancelled`] (the next delivery of a message of the key completes unrun, counted
    /// `withdrawn`), and a hold running now can no longer be extended
    /// ([`Cancelled`](crate::ErrorKind::Cancelled): its worker stops the handler, and its
    /// message, put back, completes unrun at its next delivery). The key stays taken. A key whose
    /// effect is done is refused ([`InvalidInput`](crate::ErrorKind::InvalidInput)); one
    /// cancelled before answers [`CancelOutcome::AlreadyCancelled`]. A blank `reason` or `actor`
    /// is refused. A ledger that cannot keep it answers
    /// [`Unsupported`](crate::ErrorKind::Unsupported).
    ///
    /// It marks the ledger's own table of keys: where a backend's jobs are their own ledger
    /// (PostgreSQL, SQLite), a key of those jobs is cancelled through
    /// [`Jobs::cancel_key`](crate::Jobs::cancel_key), not here.
    fn cancel_effect(
        &self,
        key: &IdempotencyKey,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<CancelOutcome>> + Send {
        let _ = (key, reason, actor);
        async { Err(Error::new(ErrorKind::Unsupported, "this effect ledger cannot cancel a key")) }
    }

    /// The ledger's [`Flow`] store, where its database keeps one: paused kinds and limits shared
    /// by every worker using this ledger. Without one, a worker keeps flow control in its own
    /// process (pauses and limits hold per process, and nothing is durable).
    fn flow(&self) -> Option<&impl Flow> {
        None::<&NoFlow>
    }
}

debug_redacted!(Hold { show: [key, provider_key, lease], hide: [token] });
