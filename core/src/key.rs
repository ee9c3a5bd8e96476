//! Idempotency keys derived from business facts, and provider keys minted once per job.
//!
//! # Canonical encoding (stable; pinned by tests)
//!
//! ```text
//! key       = kind 1*( ":" name "=" value )     facts sorted by name, byte order
//! kind/name = 1*64( ALPHA / DIGIT / "_" / "." / "-" )
//! value     = the fact's UTF-8 bytes, each byte outside ALPHA / DIGIT / "_" / "." / "-"
//!             written as "%" and two upper-case hex digits
//! ```
//!
//! `send_receipt` with `order = 42` is `send_receipt:order=42`; `grant_credits` with
//! `account = "ac 1"` and `period = 2026-11` is `grant_credits:account=ac%201:period=2026-11`.
//!
//! A canonical string longer than [`IdempotencyKey::MAX_LEN`] (128, SQS's limit for a
//! deduplication id) is shortened to its first 63 characters, `~`, and the lower-case hex
//! SHA-256 of the whole canonical string: still readable at the front, still unique, and never
//! equal to a short key, since `~` is always percent-encoded inside a value.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::{Error, ErrorKind, Result};

/// Bytes of a fact value written as they are; every other byte is percent-encoded.
const VALUE_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-');

/// One stable ID per intended effect: a job kind plus named business facts.
///
/// Build it with [`IdempotencyKey::builder`]; the facts (an order id, an account and a billing
/// period) decide the key, never the attempt or the time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key produced, in bytes (all keys are ASCII).
    pub const MAX_LEN: usize = 128;
    const HASHED_PREFIX_LEN: usize = Self::MAX_LEN - 1 - 64;

    /// Starts a key for `kind`; add at least one fact, then [`KeyBuilder::build`].
    pub fn builder(kind: impl Into<String>) -> KeyBuilder {
        KeyBuilder { kind: kind.into(), facts: Vec::new() }
    }

    /// Accepts a key as stored by a backend or sent by another producer, checking its shape.
    pub fn parse(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        let valid = !key.is_empty()
            && key.len() <= Self::MAX_LEN
            && key.bytes().all(|b| b.is_ascii_graphic())
            && key.contains(':');
        if valid { Ok(Self(key)) } else { Err(Error::new(ErrorKind::InvalidKey, "not a canonical idempotency key")) }
    }

    /// The canonical string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        Self::parse(value)
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}

/// Collects the facts of an [`IdempotencyKey`].
#[derive(Debug, Clone)]
#[must_use = "a key builder does nothing until `build` is called"]
pub struct KeyBuilder {
    kind: String,
    facts: Vec<(String, String)>,
}

impl KeyBuilder {
    /// Adds a named business fact, such as `("order", 42)` or `("period", "2026-11")`.
    pub fn fact(mut self, name: impl Into<String>, value: impl fmt::Display) -> Self {
        self.facts.push((name.into(), value.to_string()));
        self
    }

    /// Checks the facts and writes the canonical key.
    ///
    /// Refused with [`ErrorKind::InvalidKey`]: no facts, an empty value, a name given twice.
    /// Refused with [`ErrorKind::InvalidName`]: a kind or name outside `[A-Za-z0-9_.-]{1,64}`.
    pub fn build(mut self) -> Result<IdempotencyKey> {
        check_name("job kind", &self.kind)?;
        if self.facts.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!("a key for `{}` needs at least one business fact", self.kind),
            ));
        }
        self.facts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut canonical = self.kind.clone();
        for (i, (name, value)) in self.facts.iter().enumerate() {
            check_name("fact name", name)?;
            if i > 0 && self.facts[i - 1].0 == *name {
                return Err(Error::new(ErrorKind::InvalidKey, format!("fact `{name}` is given twice")));
            }
            if value.is_empty() {
                return Err(Error::new(ErrorKind::InvalidKey, format!("fact `{name}` is empty")));
            }
            canonical.push(':');
            canonical.push_str(name);
            canonical.push('=');
            canonical.extend(utf8_percent_encode(value, VALUE_SET));
        }
        if canonical.len() > IdempotencyKey::MAX_LEN {
            let digest = hex::encode(Sha256::digest(canonical.as_bytes()));
            canonical.truncate(IdempotencyKey::HASHED_PREFIX_LEN);
            canonical.push('~');
            canonical.push_str(&digest);
        }
        Ok(IdempotencyKey(canonical))
    }
}

/// Checks a job kind, fact name, queue or schema-like name against `[A-Za-z0-9_.-]{1,64}`.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidName,
            format!("{what} {name:?} must be 1 to 64 characters of A-Z a-z 0-9 _ . -"),
        ))
    }
}

/// A random UUID v4 minted once when a job is created and sent unchanged on every attempt and
/// every replay, for providers that take their own idempotency key (Stripe-style).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProviderKey(Uuid);

impl ProviderKey {
    /// Mints a new key. Call it when the job is created, never inside a retry.
    pub fn mint() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps a stored key.
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, facts: &[(&str, &str)]) -> Result<IdempotencyKey> {
        facts.iter().fold(IdempotencyKey::builder(kind), |b, (n, v)| b.fact(*n, v)).build()
    }

    /// These strings are a compatibility promise: a change here re-keys every stored job.
    #[test]
    fn known_keys_encode_to_known_strings() {
        assert_eq!(key("send_receipt", &[("order", "42")]).unwrap().as_str(), "send_receipt:order=42");
        assert_eq!(
            key("grant_credits", &[("period", "2026-11"), ("account", "ac 1")]).unwrap().as_str(),
            "grant_credits:account=ac%201:period=2026-11"
        );
        assert_eq!(
            key("notify", &[("to", "zoë@example.com"), ("k", "a:b=c~d/%")]).unwrap().as_str(),
            "notify:k=a%3Ab%3Dc%7Ed%2F%25:to=zo%C3%AB%40example.com"
        );
        let long = "x".repeat(200);
        assert_eq!(
            key("bulk", &[("batch", &long)]).unwrap().as_str(),
            format!("bulk:batch={}~3ddace3ecc540660a8d349df9905b5d97d754e94479b8aa717486e198309bd65", "x".repeat(52))
        );
    }

    #[test]
    fn fact_order_does_not_matter_and_values_do() {
        let a = key("k", &[("a", "1"), ("b", "2")]).unwrap();
        let b = key("k", &[("b", "2"), ("a", "1")]).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, key("k", &[("a", "1"), ("b", "3")]).unwrap());
        // A separator inside a value cannot forge another fact list.
        assert_ne!(key("k", &[("a", "1:b=2")]).unwrap(), a);
    }

    #[test]
    fn long_keys_stay_bounded_and_distinct() {
        let a = key("bulk", &[("batch", &"y".repeat(500))]).unwrap();
        let b = key("bulk", &[("batch", &format!("{}z", "y".repeat(499)))]).unwrap();
        assert_eq!(a.as_str().len(), IdempotencyKey::MAX_LEN);
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("bulk:batch=yyy"));
    }

    #[test]
    fn bad_facts_are_typed_errors() {
        assert_eq!(key("k", &[]).unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(key("k", &[("a", "")]).unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(key("k", &[("a", "1"), ("a", "2")]).unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(key("bad kind", &[("a", "1")]).unwrap_err().kind(), ErrorKind::InvalidName);
        assert_eq!(key("k", &[("a=b", "1")]).unwrap_err().kind(), ErrorKind::InvalidName);
    }

    #[test]
    fn keys_round_trip_through_serde_and_parse() {
        let k = key("send_receipt", &[("order", "42")]).unwrap();
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, "\"send_receipt:order=42\"");
        assert_eq!(serde_json::from_str::<IdempotencyKey>(&json).unwrap(), k);
        assert!(IdempotencyKey::parse("no separator").is_err());
    }

    #[test]
    fn provider_keys_are_v4_and_distinct() {
        let (a, b) = (ProviderKey::mint(), ProviderKey::mint());
        assert_ne!(a, b);
        assert_eq!(a.as_uuid().get_version_num(), 4);
    }
}
