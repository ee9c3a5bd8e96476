//! What every provider's check shares: the refusal, the delivery it yields, HMAC-SHA256 with a
//! constant-time comparison, and the signature timestamp's window.

use std::fmt;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A provider's signature scheme: checks a delivery on its raw bytes, before anything parses
/// them, and names the event it carries.
pub trait Provider: Send + Sync + 'static {
    /// The provider's name, in keys and logs: `stripe`, `github`, `standard`.
    fn name(&self) -> &'static str;

    /// Checks the signature in `headers` over `body` and, where the scheme signs a timestamp,
    /// that it is within the window of `now` (Unix seconds); then the event's id and type.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<Delivery, Refused>;
}

/// A delivery whose signature checked: the provider's event id (the idempotency key's fact)
/// and the event type, where the provider names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Stripe's event `id`, GitHub's `X-GitHub-Delivery`, Standard Webhooks' `webhook-id`.
    pub id: String,
    /// Stripe's `type`, GitHub's `X-GitHub-Event`, the `type` of a Standard Webhooks payload.
    pub event_type: Option<String>,
}

/// Why a delivery was refused before anything was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// A header the scheme needs is not there (`400`).
    MissingHeader(&'static str),
    /// A header or the body is not in the scheme's form (`400`).
    Malformed(String),
    /// No signature matches any of the endpoint's secrets (`401`).
    BadSignature,
    /// The signed timestamp is further than the window from now: a replayed or delayed
    /// delivery (`401`).
    OutsideWindow {
        /// Seconds from the signed timestamp to now (negative: in the future).
        age: i64,
    },
}

impl Refused {
    /// The answer the provider gets: `400` for a delivery that is not in the scheme's form,
    /// `401` for one whose signature or timestamp does not check.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingHeader(_) | Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::BadSignature | Self::OutsideWindow { .. } => StatusCode::UNAUTHORIZED,
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingHeader(name) => write!(f, "no {name} header"),
            Self::Malformed(what) => f.write_str(what),
            Self::BadSignature => f.write_str("no signature matches the endpoint's secrets"),
            Self::OutsideWindow { age } => {
                write!(f, "the signed timestamp is {age} s from now, outside the endpoint's window")
            }
        }
    }
}

impl std::error::Error for Refused {}

/// HMAC-SHA256 of `parts`, in order, under `key`.
fn hmac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// The HMAC-SHA256 of `parts` under `key`: a signature, for senders and tests.
pub(super) fn sign(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    hmac(key, parts).finalize().into_bytes().to_vec()
}

/// Whether `signature` is the HMAC of `parts` under `key`, compared in constant time.
pub(super) fn matches(key: &[u8], parts: &[&[u8]], signature: &[u8]) -> bool {
    hmac(key, parts).verify_slice(signature).is_ok()
}

/// The header's value as text, or the refusal that names it.
pub(super) fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, Refused> {
    let value = headers.get(name).ok_or(Refused::MissingHeader(name))?;
    value.to_str().map_err(|_| Refused::Malformed(format!("{name} is not visible ASCII")))
}

/// Checks that `timestamp` (Unix seconds) is within `window` of `now`, either way.
pub(super) fn within(timestamp: i64, now: i64, window: Duration) -> Result<(), Refused> {
    let age = now.saturating_sub(timestamp);
    if age.unsigned_abs() > window.as_secs() { Err(Refused::OutsideWindow { age }) } else { Ok(()) }
}

/// The `id` and `type` of a JSON event body (Stripe's, a Standard Webhooks payload's).
#[derive(serde::Deserialize)]
pub(super) struct Named {
    pub(super) id: Option<String>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
}

pub(super) fn named(body: &[u8]) -> Result<Named, Refused> {
    serde_json::from_slice(body).map_err(|_| Refused::Malformed("the body is not a JSON object".into()))
}

/// Refuses an id that is empty, long, or not visible ASCII: it becomes a key's fact.
pub(super) fn event_id(id: &str, source: &str) -> Result<String, Refused> {
    if id.is_empty() || id.len() > 255 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refused::Malformed(format!("{source} is not an event id (1 to 255 visible ASCII characters)")));
    }
    Ok(id.to_owned())
}
