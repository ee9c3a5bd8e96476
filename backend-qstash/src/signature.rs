//! `Upstash-Signature`: an HS256 JWT over the delivery, signed with the current or the next
//! signing key. The JWT crate checks the algorithm and the MAC; the claims are checked here
//! against the configured URL, the raw body and the injected clock.

use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::{Clock, SigningKeys};

#[derive(Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    exp: i64,
    nbf: i64,
    body: String,
}

/// Why a signature was refused when neither key verifies it: the one refusal that fresh keys
/// (after a rotation) could turn into an acceptance.
pub(crate) const NOT_OUR_KEYS: &str =
    "the signature is not an HS256 JWT signed with the current or the next signing key";

/// Checks deliveries' signatures.
pub(crate) struct Verifier {
    keys: RwLock<SigningKeys>,
    url: String,
    leeway: Duration,
    clock: Clock,
}

impl Verifier {
    pub(crate) fn new(keys: SigningKeys, url: String, leeway: Duration, clock: Clock) -> Self {
        Self { keys: RwLock::new(keys), url, leeway, clock }
    }

    /// Takes the keys QStash signs with now (after a rotation).
    pub(crate) fn replace_keys(&self, keys: SigningKeys) {
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = keys;
    }

    /// Why `token` does not sign `body` for this receiver, if it does not. The reason names a
    /// claim, never a value.
    pub(crate) fn verify(&self, token: &str, body: &[u8]) -> Result<(), &'static str> {
        let mut validation = Validation::new(Algorithm::HS256);
        // Time and issuer are checked below, against the injected clock and with reasons.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims = HashSet::new();
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        let claims = [&keys.current, &keys.next]
            .into_iter()
            .find_map(|key| {
                let key = DecodingKey::from_secret(key.as_bytes()).ok()?;
                jsonwebtoken::decode::<Claims>(token, &key, &validation).ok()
            })
            .ok_or(NOT_OUR_KEYS)?
            .claims;
        if claims.iss != "Upstash" {
            return Err("the signature's issuer is not Upstash");
        }
        if claims.sub != self.url {
            return Err("the signature was made for another URL");
        }
        let now = (self.clock)().timestamp();
        let leeway = i64::try_from(self.leeway.as_secs()).unwrap_or(i64::MAX);
        if now > claims.exp.saturating_add(leeway) {
            return Err("the signature has expired");
        }
        if now < claims.nbf.saturating_sub(leeway) {
            return Err("the signature is not valid yet");
        }
        let digest = URL_SAFE_NO_PAD.encode(Sha256::digest(body));
        if claims.body.trim_end_matches('=') != digest {
            return Err("the body is not the one signed");
        }
        Ok(())
    }
}
