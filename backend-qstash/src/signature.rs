//! `Upstash-Signature`: an HS256 JWT over the delivery, signed with the current or the next
//! signing key. The JWT crate checks the algorithm and the MAC; the claims are checked here
//! against the configured URL and the injected clock before the body is read, then against the
//! raw body. A token is accepted once: QStash signs every attempt with a token of its own (its
//! `jti`), so a token seen again is a captured delivery sent again.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
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
    #[serde(default)]
    jti: Option<String>,
}

/// A token whose key, issuer, URL and time hold; its body is checked once read.
pub(crate) struct Token {
    /// What names the token among those seen: its `jti`, or its MAC when it has none.
    pub(crate) id: String,
    /// When it expires, unix seconds.
    exp: i64,
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
    seen: Mutex<Seen>,
}

impl Verifier {
    pub(crate) fn new(keys: SigningKeys, url: String, leeway: Duration, clock: Clock) -> Self {
        Self { keys: RwLock::new(keys), url, leeway, clock, seen: Mutex::default() }
    }

    /// Takes the keys QStash signs with now (after a rotation).
    pub(crate) fn replace_keys(&self, keys: SigningKeys) {
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = keys;
    }

    /// The token, if its key, issuer, URL and time hold: checked before the body is read, so a
    /// request without a valid signature holds no connection while its body trickles in. The
    /// reason names a claim, never a value.
    pub(crate) fn check_token(&self, token: &str) -> Result<Token, &'static str> {
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
        if now > claims.exp.saturating_add(self.leeway()) {
            return Err("the signature has expired");
        }
        if now < claims.nbf.saturating_sub(self.leeway()) {
            return Err("the signature is not valid yet");
        }
        let id = claims.jti.unwrap_or_else(|| token.rsplit('.').next().unwrap_or_default().to_owned());
        Ok(Token { id, exp: claims.exp, body: claims.body })
    }

    /// Whether `body` is the one `token` signs.
    pub(crate) fn check_body(token: &Token, body: &[u8]) -> Result<(), &'static str> {
        let digest = URL_SAFE_NO_PAD.encode(Sha256::digest(body));
        if token.body.trim_end_matches('=') != digest {
            return Err("the body is not the one signed");
        }
        Ok(())
    }

    fn leeway(&self) -> i64 {
        i64::try_from(self.leeway.as_secs()).unwrap_or(i64::MAX)
    }

    /// Whether `token` was accepted before (and, with `keep`, remembers it now as accepted). A
    /// token is remembered until it expires (QStash's last five minutes), then forgotten: an
    /// expired token is refused anyway.
    pub(crate) fn seen(&self, token: &Token, keep: bool) -> bool {
        let now = (self.clock)().timestamp();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if now >= seen.next_prune {
            let leeway = self.leeway();
            seen.tokens.retain(|_, exp| exp.saturating_add(leeway) >= now);
            seen.next_prune = now + 10;
        }
        if seen.tokens.contains_key(&token.id) {
            return true;
        }
        if keep {
            seen.tokens.insert(token.id.clone(), token.exp);
        }
        false
    }
}

/// The tokens accepted and not yet expired.
#[derive(Default)]
struct Seen {
    tokens: HashMap<String, i64>,
    /// When expired tokens are next dropped, unix seconds.
    next_prune: i64,
}
