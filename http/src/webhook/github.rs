//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw body under the
//! webhook's secret; the delivery's GUID in `X-GitHub-Delivery` (kept by a redelivery), the
//! event in `X-GitHub-Event`. GitHub signs no timestamp, so there is no window: a captured
//! delivery sent again is a duplicate of its GUID, answered and not run again.

use axum::http::HeaderMap;

use super::verify::{Delivery, Provider, Refused, event_id, header, matches, sign};

/// GitHub's webhook signatures, checked with the webhook's secrets.
#[derive(Clone)]
pub struct GitHub {
    secrets: Vec<String>,
}

impl GitHub {
    /// Checks against the webhook's `secret`.
    pub fn new(secret: impl Into<String>) -> Self {
        Self { secrets: vec![secret.into()] }
    }

    /// Accepts signatures made with `secret` too, while you change the webhook's secret.
    pub fn also(mut self, secret: impl Into<String>) -> Self {
        self.secrets.push(secret.into());
        self
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
        if !self.secrets.iter().any(|secret| matches(secret.as_bytes(), &[body], &signature)) {
            return Err(Refused::BadSignature);
        }
        let id = event_id(header(headers, "x-github-delivery")?, "X-GitHub-Delivery")?;
        let event_type = headers.get("x-github-event").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok(Delivery { id, event_type })
    }
}
