//! The in-memory effect ledger: keys, their holds and their results.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{MemoryBackend, State, token};
use crate::backend::{Begin, CancelOutcome, Cancellation, Hold, Ledger, require_cancel_audit};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{IdempotencyKey, ProviderKey};

/// A key's entry: the payload it was begun with, its provider key, and where its effect stands.
#[derive(Debug)]
pub(super) struct LedgerEntry {
    fingerprint: String,
    provider_key: ProviderKey,
    pub(super) state: Effect,
}

#[derive(Debug)]
pub(super) enum Effect {
    Pending {
        token: String,
        until: Instant,
    },
    Done {
        result: Value,
        at: Instant,
    },
    /// Cancelled by a person: begins answer so, whatever the payload.
    Cancelled(Cancellation),
}

impl State {
    /// Forgets done ledger keys finished `retention` ago or more: `key` at once (so it never
    /// answers late), all of them at most once per sixteenth of the retention (so a sweep's cost
    /// is spread over many begins). Alert keys stay, as with Postgres's `prune_done`: while their
    /// record is open, a forgotten one would page again.
    pub(super) fn expire_keys(&mut self, key: &IdempotencyKey, retention: Duration, now: Instant) {
        let expired = |key: &IdempotencyKey, e: &LedgerEntry| {
            matches!(e.state, Effect::Done { at, .. } if now.duration_since(at) >= retention)
                && !key.as_str().starts_with("redrive_alert:")
        };
        if self.ledger_swept.is_none_or(|swept| now.duration_since(swept) >= retention / 16) {
            self.ledger.retain(|key, e| !expired(key, e));
            self.ledger_swept = Some(now);
        } else if self.ledger.get(key).is_some_and(|e| expired(key, e)) {
            self.ledger.remove(key);
        }
    }
}

impl Ledger for MemoryBackend {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let fingerprint = &crate::job::payload_fingerprint(payload);
        let now = Instant::now();
        let mut state = self.lock();
        state.expire_keys(key, self.ledger_retention, now);
        let Some(entry) = state.ledger.get_mut(key) else {
            let token = token();
            let pending = Effect::Pending { token: token.clone(), until: now + hold };
            let entry = LedgerEntry { fingerprint: fingerprint.to_owned(), provider_key, state: pending };
            state.ledger.insert(key.clone(), entry);
            return Ok(Begin::Fresh(Hold { key: key.clone(), token, provider_key, lease: None }));
        };
        if let Effect::Cancelled(cancel) = &entry.state {
            return Ok(Begin::Cancelled(cancel.clone()));
        }
        if entry.fingerprint != *fingerprint {
            return Err(Error::new(ErrorKind::KeyConflict, format!("key {key} was used with a different payload")));
        }
        match &mut entry.state {
            Effect::Done { result, .. } => Ok(Begin::Done(result.clone())),
            Effect::Cancelled(_) => unreachable!("answered above"),
            Effect::Pending { until, .. } if *until > now => Ok(Begin::Busy(*until - now)),
            Effect::Pending { token: held, until } => {
                *held = token();
                *until = now + hold;
                let hold =
                    Hold { key: key.clone(), token: held.clone(), provider_key: entry.provider_key, lease: None };
                Ok(Begin::Resumed(hold))
            }
        }
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        match self.lock().ledger.get_mut(&hold.key).map(|e| &mut e.state) {
            Some(Effect::Pending { token, until }) if *token == hold.token => {
                *until = Instant::now() + by;
                Ok(())
            }
            Some(Effect::Cancelled(_)) => {
                Err(Error::new(ErrorKind::Cancelled, format!("key {} was cancelled while it was held", hold.key)))
            }
            _ => Err(Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held by this attempt", hold.key))),
        }
    }

    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        if let Some(Effect::Pending { token, until }) = self.lock().ledger.get_mut(&hold.key).map(|e| &mut e.state)
            && *token == hold.token
        {
            *until = Instant::now();
        }
        Ok(())
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        if let Some(entry) = self.lock().ledger.get_mut(&hold.key)
            && !matches!(entry.state, Effect::Done { .. })
        {
            entry.state = Effect::Done { result: result.clone(), at: Instant::now() };
        }
        Ok(())
    }

    async fn cancel_effect(&self, key: &IdempotencyKey, reason: &str, actor: &str) -> Result<CancelOutcome> {
        require_cancel_audit(reason, actor)?;
        let mut state = self.lock();
        let cancel = Cancellation { at: chrono::Utc::now(), reason: reason.to_owned(), actor: actor.to_owned() };
        match state.ledger.get_mut(key) {
            None => {
                // No payload seen yet: any payload of the key finds it cancelled.
                let entry = LedgerEntry {
                    fingerprint: String::new(),
                    provider_key: ProviderKey::mint(),
                    state: Effect::Cancelled(cancel),
                };
                state.ledger.insert(key.clone(), entry);
            }
            Some(entry) => match &entry.state {
                Effect::Done { .. } => {
                    return Err(Error::new(
                        ErrorKind::InvalidInput,
                        format!("the effect of key {key} is done: there is nothing left to cancel"),
                    ));
                }
                Effect::Cancelled(before) => return Ok(CancelOutcome::AlreadyCancelled(before.clone())),
                Effect::Pending { .. } => entry.state = Effect::Cancelled(cancel),
            },
        }
        tracing::info!(key = %key, actor, "key cancelled in the effect ledger");
        Ok(CancelOutcome::Cancelled)
    }

    fn flow(&self) -> Option<&impl crate::backend::Flow> {
        Some(self)
    }
}
