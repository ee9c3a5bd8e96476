//! What every provider's check shares: the refusal, the delivery it yields, HMAC-SHA256 with a
//! constant-time comparison, and the signature timestamp's window.

use std::fmt;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A provider's signature scheme: checks a delivery on its raw bytes, before anything parses
/// them, and names the event it carries.
pub trait Provider: Send + Sync + 'static {
    /// The provider's name, in keys and logs: `stripe`, `github`, `standard`.
    fn name(&self) -> &'static str;

    /// Checks the signature in `headers` over `body` and, where the scheme signs a timestamp,
    /// that it is within the window of `now` (Unix seconds); then parses the body and names the
    /// event's id and type.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<Delivery, Refused>;

    /// Removes from a verified event what the provider changes between deliveries of the same
    /// event (Stripe's `pending_webhooks`), so that a redelivery is a duplicate of the first,
    /// not another body under its id. Nothing by default.
    fn settle(&self, _event: &mut serde_json::Value) {}
}

/// A delivery whose signature checked: the event's signed identity (the idempotency key's
/// fact), what else the provider says of it, and the body as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The event's identity, covered by the signature: Stripe's event `id`, Standard Webhooks'
    /// `webhook-id`; for GitHub, which signs only the body, the body's SHA-256 (hex), so that a
    /// captured delivery resent under a fresh `X-GitHub-Delivery` is still the same event.
    pub id: String,
    /// GitHub's `X-GitHub-Delivery`, not signed: logged, and not stored, so that a resend under
    /// a fresh GUID is the same job.
    pub delivery: Option<String>,
    /// Stripe's `type`, GitHub's `X-GitHub-Event` (not signed), the `type` of a Standard
    /// Webhooks payload.
    pub event_type: Option<String>,
    /// The body, parsed once the signature checked (a body that is not JSON is refused).
    pub event: serde_json::Value,
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

/// The most signatures one delivery may carry: a roll has two or three; more is an attempt to
/// make each request cost many comparisons.
const MAX_SIGNATURES: usize = 8;

/// The HMAC-SHA256 of `parts`, in order, under `key`.
pub(super) fn sign(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// Whether any of `signatures` is the HMAC of `parts` under any of `keys`. Each key's MAC is
/// computed once (however many signatures a sender lists), and compared in constant time.
pub(super) fn signed_by_any(keys: &[&[u8]], parts: &[&[u8]], signatures: &[Vec<u8>]) -> Result<bool, Refused> {
    if signatures.len() > MAX_SIGNATURES {
        return Err(Refused::Malformed(format!("more than {MAX_SIGNATURES} signatures")));
    }
    Ok(keys.iter().any(|key| {
        let mac = sign(key, parts);
        signatures.iter().any(|s| bool::from(mac.as_slice().ct_eq(s.as_slice())))
    }))
}

/// Refuses an empty secret: a delivery signed under an empty key proves nothing, and an unset
/// variable read as "" would otherwise accept anyone's.
pub(super) fn check_secret(key: &[u8], provider: &str) -> redrive_core::Result<()> {
    if key.is_empty() {
        return Err(redrive_core::Error::new(
            redrive_core::ErrorKind::Config,
            format!("a {provider} webhook secret is empty: set the endpoint's signing secret"),
        ));
    }
    Ok(())
}

/// The header's value as text, or the refusal that names it.
pub(super) fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, Refused> {
    header_or(headers, name, None)
}

/// [`header`], falling back to `alias` when `name` is not there (Svix's `svix-*` names for
/// Standard Webhooks' `webhook-*`).
pub(super) fn header_or<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
    alias: Option<&'static str>,
) -> Result<&'a str, Refused> {
    let value = headers.get(name).or_else(|| alias.and_then(|a| headers.get(a))).ok_or(Refused::MissingHeader(name))?;
    value.to_str().map_err(|_| Refused::Malformed(format!("{name} is not visible ASCII")))
}

/// Checks that `timestamp` (Unix seconds) is within `window` of `now`, either way.
pub(super) fn within(timestamp: i64, now: i64, window: Duration) -> Result<(), Refused> {
    let age = now.saturating_sub(timestamp);
    if age.unsigned_abs() > window.as_secs() { Err(Refused::OutsideWindow { age }) } else { Ok(()) }
}

/// The verified body as JSON, parsed once for the provider's fields and the job's payload.
pub(super) fn json(body: &[u8]) -> Result<serde_json::Value, Refused> {
    serde_json::from_slice(body).map_err(|_| Refused::Malformed("the body is not JSON".into()))
}

/// The string at `field` of a JSON object (Stripe's `id`, an event's `type`).
pub(super) fn text(event: &serde_json::Value, field: &str) -> Option<String> {
    event.get(field).and_then(serde_json::Value::as_str).map(str::to_owned)
}

/// Refuses an id that is empty, long, or not visible ASCII: it becomes a key's fact.
pub(super) fn event_id(id: &str, source: &str) -> Result<String, Refused> {
    if id.is_empty() || id.len() > 255 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refused::Malformed(format!("{source} is not an event id (1 to 255 visible ASCII characters)")));
    }
    Ok(id.to_owned())
}
