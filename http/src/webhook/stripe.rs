//! Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, each `v1` the HMAC-SHA256
//! of `"<t>.<raw body>"` under an endpoint secret (its bytes as given, `whsec_` included). During
//! a secret roll Stripe signs with every active secret; other schemes (`v0`) are ignored.

use std::time::Duration;

use axum::http::HeaderMap;
use redrive_core::Result;
use serde_json::Value;

use super::verify::{
    Delivery, Provider, Refused, check_secret, event_id, header, json, sign, signed_by_any, text, within,
};

/// Stripe's webhook signatures, checked with an endpoint's signing secrets.
#[derive(Clone)]
pub struct Stripe {
    secrets: Vec<String>,
    window: Duration,
}

impl Stripe {
    /// Checks against `secret` (`whsec_…`, the endpoint's signing secret), with Stripe's
    /// five-minute window on the signed timestamp. An empty secret is refused (`Config`).
    pub fn new(secret: impl Into<String>) -> Result<Self> {
        Self { secrets: Vec::new(), window: Duration::from_secs(300) }.also(secret)
    }

    /// Accepts signatures made with `secret` too: the old and the new secret while you roll it.
    pub fn also(mut self, secret: impl Into<String>) -> Result<Self> {
        let secret = secret.into();
        check_secret(secret.as_bytes(), "Stripe")?;
        self.secrets.push(secret);
        Ok(self)
    }

    /// How far the signed timestamp may be from now, either way (five minutes by default):
    /// a delivery captured and sent again later is refused.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The `Stripe-Signature` value Stripe would send for `body` at `timestamp`, one `v1` per
    /// secret: for your tests, and for events your own code forwards.
    pub fn signature_header(&self, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let mut value = format!("t={t}");
        for secret in &self.secrets {
            value.push_str(",v1=");
            value.push_str(&hex::encode(sign(secret.as_bytes(), &[t.as_bytes(), b".", body])));
        }
        value
    }
}

impl std::fmt::Debug for Stripe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stripe").field("secrets", &self.secrets.len()).field("window", &self.window).finish()
    }
}

impl Provider for Stripe {
    fn name(&self) -> &'static str {
        "stripe"
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<Delivery, Refused> {
        let value = header(headers, "stripe-signature")?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        // Empty elements are skipped, as Stripe's own libraries do.
        for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, item)) = pair.split_once('=') else {
                return Err(Refused::Malformed("Stripe-Signature is not a list of key=value pairs".into()));
            };
            match name {
                "t" if timestamp.is_none() => timestamp = Some(item),
                "t" => return Err(Refused::Malformed("Stripe-Signature has two timestamps".into())),
                // A signature that is not hex matches nothing; the others may.
                "v1" => signatures.extend(hex::decode(item).ok()),
                _ => {}
            }
        }
        let t = timestamp.ok_or_else(|| Refused::Malformed("Stripe-Signature has no timestamp".into()))?;
        let seconds: i64 =
            t.parse().map_err(|_| Refused::Malformed("Stripe-Signature's timestamp is not a number".into()))?;
        let keys: Vec<&[u8]> = self.secrets.iter().map(|s| s.as_bytes()).collect();
        if !signed_by_any(&keys, &[t.as_bytes(), b".", body], &signatures)? {
            return Err(Refused::BadSignature);
        }
        within(seconds, now, self.window)?;
        let event = json(body)?;
        let id = text(&event, "id").ok_or_else(|| Refused::Malformed("the event has no id".into()))?;
        Ok(Delivery { id: event_id(&id, "the event's id")?, delivery: None, event_type: text(&event, "type"), event })
    }

    /// `pending_webhooks` counts the endpoints still waiting for the event: it changes between
    /// Stripe's retries of one event.
    fn settle(&self, event: &mut Value) {
        if let Some(event) = event.as_object_mut() {
            event.remove("pending_webhooks");
        }
    }
}
