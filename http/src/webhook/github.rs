//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw body under the
//! webhook's secret; the delivery's GUID in `X-GitHub-Delivery`, the event in `X-GitHub-Event`.
//! Neither header is signed, and GitHub signs no timestamp: a captured delivery can be resent
//! under a fresh GUID at any time. So the event's identity is the body's SHA-256: a resend, or
//! GitHub's own redelivery, is a duplicate of the first; the GUID is kept for logs.

use axum::http::HeaderMap;
use redrive_core::Result;
use sha2::{Digest, Sha256};

use super::verify::{Delivery, Provider, Refused, check_secret, header, json, sign, signed_by_any};

/// GitHub's webhook signatures, checked with the webhook's secrets.
#[derive(Clone)]
pub struct GitHub {
    secrets: Vec<String>,
}

impl GitHub {
    /// Checks against the webhook's `secret`. An empty secret is refused (`Config`).
    pub fn new(secret: impl Into<String>) -> Result<Self> {
        Self { secrets: Vec::new() }.also(secret)
    }

    /// Accepts signatures made with `secret` too, while you change the webhook's secret.
    pub fn also(mut self, secret: impl Into<String>) -> Result<Self> {
        let secret = secret.into();
        check_secret(secret.as_bytes(), "GitHub")?;
        self.secrets.push(secret);
        Ok(self)
    }

    /// The `X-Hub-Signature-256` value GitHub would send for `body`, under the first secret.
    pub fn signature_header(&self, body: &[u8]) -> String {
        format!("sha256={}", hex::encode(sign(self.secrets[0].as_bytes(), &[body])))
    }
}

impl std::fmt::Debug for GitHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHub").field("secrets", &self.secrets.len()).finish()
    }
}

impl Provider for GitHub {
    fn name(&self) -> &'static str {
        "github"
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], _now: i64) -> Result<Delivery, Refused> {
        let value = header(headers, "x-hub-signature-256")?;
        let signature = value
            .strip_prefix("sha256=")
            .and_then(|h| hex::decode(h).ok())
            .ok_or_else(|| Refused::Malformed("X-Hub-Signature-256 is not sha256=<hex>".into()))?;
        let keys: Vec<&[u8]> = self.secrets.iter().map(|s| s.as_bytes()).collect();
        if !signed_by_any(&keys, &[body], &[signature])? {
            return Err(Refused::BadSignature);
        }
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok(Delivery {
            id: hex::encode(Sha256::digest(body)),
            delivery: text("x-github-delivery"),
            event_type: text("x-github-event"),
            // Set the webhook's content type to application/json: a form-encoded body is refused.
            event: json(body)?,
        })
    }
}
