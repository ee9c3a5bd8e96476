//! [`Ledger`]: the effect ledger, what makes an effect happen once.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use super::Lease;
use super::flow::{Flow, NoFlow};
use crate::error::Result;
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

    /// Marks the effect done with its result. Idempotent.
    fn finish(&self, hold: &Hold, result: &Value) -> impl Future<Output = Result<()>> + Send;

    /// The ledger's [`Flow`] store, where its database keeps one: paused kinds and limits shared
    /// by every worker using this ledger. Without one, a worker keeps flow control in its own
    /// process (pauses and limits hold per process, and nothing is durable).
    fn flow(&self) -> Option<&impl Flow> {
        None::<&NoFlow>
    }
}

debug_redacted!(Hold { show: [key, provider_key, lease], hide: [token] });
