//! Standard Webhooks (Svix, Resend, Clerk, OpenAI and others): `webhook-id`, `webhook-timestamp`
//! and `webhook-signature`, a space-separated list of `v1,<base64>`, each the HMAC-SHA256 of
//! `"<id>.<timestamp>.<raw body>"` under a secret that is `whsec_` and base64. Svix's senders
//! (Resend, Clerk) name the same headers `svix-id`, `svix-timestamp` and `svix-signature`: either
//! is read. Asymmetric signatures (`v1a`) are not checked: a delivery needs one `v1` that matches.

use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use redrive_core::{Error, ErrorKind, Result};

use super::verify::{
    Delivery, Provider, Refused, check_secret, event_id, header_or, json, sign, signed_by_any, text, within,
};

/// Standard Webhooks signatures, checked with an endpoint's secrets.
#[derive(Clone)]
pub struct StandardWebhooks {
    keys: Vec<Vec<u8>>,
    window: Duration,
}

fn key(secret: &str) -> Result<Vec<u8>> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = STANDARD.decode(encoded).or_else(|_| STANDARD_NO_PAD.decode(encoded)).map_err(|_| {
        Error::new(ErrorKind::Config, "a Standard Webhooks secret is `whsec_` and base64; this one does not decode")
    })?;
    check_secret(&key, "Standard Webhooks")?;
    Ok(key)
}

impl StandardWebhooks {
    /// Checks against `secret` (`whsec_<base64>`), with the specification's five-minute window
    /// on the signed timestamp. A secret that does not decode is refused (`Config`).
    pub fn new(secret: &str) -> Result<Self> {
        Ok(Self { keys: vec![key(secret)?], window: Duration::from_secs(300) })
    }

    /// Accepts signatures made with `secret` too, while you roll it.
    pub fn also(mut self, secret: &str) -> Result<Self> {
        self.keys.push(key(secret)?);
        Ok(self)
    }

    /// How far the signed timestamp may be from now, either way (five minutes by default).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The `webhook-signature` value a sender would set for message `id` at `timestamp`, one
    /// `v1` per secret.
    pub fn signature_header(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let signatures: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("v1,{}", STANDARD.encode(sign(k, &[id.as_bytes(), b".", t.as_bytes(), b".", body]))))
            .collect();
        signatures.join(" ")
    }
}

impl std::fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandardWebhooks").field("secrets", &self.keys.len()).field("window", &self.window).finish()
    }
}

impl Provider for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard"
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<Delivery, Refused> {
        let id = header_or(headers, "webhook-id", Some("svix-id"))?;
        let t = header_or(headers, "webhook-timestamp", Some("svix-timestamp"))?;
        let seconds: i64 = t.parse().map_err(|_| Refused::Malformed("webhook-timestamp is not a number".into()))?;
        let signatures: Vec<Vec<u8>> = header_or(headers, "webhook-signature", Some("svix-signature"))?
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|s| STANDARD.decode(s).ok())
            .collect();
        let keys: Vec<&[u8]> = self.keys.iter().map(Vec::as_slice).collect();
        if !signed_by_any(&keys, &[id.as_bytes(), b".", t.as_bytes(), b".", body], &signatures)? {
            return Err(Refused::BadSignature);
        }
        within(seconds, now, self.window)?;
        let event = json(body)?;
        Ok(Delivery { id: event_id(id, "webhook-id")?, delivery: None, event_type: text(&event, "type"), event })
    }
}
