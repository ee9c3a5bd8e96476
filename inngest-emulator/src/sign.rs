//! Inngest's request signatures and signing-key bearers, as the SDKs check and send them.
//!
//! A signature is `t=<unix seconds>&s=<hex HMAC-SHA256>`, keyed with the signing key's text after
//! its `signkey-<env>-` prefix (the hex text's bytes, not the bytes it encodes), over the body
//! followed by the decimal timestamp. The SDKs check a request over the body's canonical JSON
//! (RFC 8785), so the emulator sends exactly that form; they sign their responses over the bytes
//! they send.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Signatures this far from the clock, either way, are refused (the JS SDK's window).
pub(crate) const TOLERANCE_SECS: i64 = 300;

/// The key text the MAC is keyed with: the signing key after its `signkey-<env>-` prefix.
pub(crate) fn key_body(key: &str) -> &str {
    match key.strip_prefix("signkey-") {
        Some(rest) => rest.split_once('-').map_or(key, |(_, body)| body),
        None => key,
    }
}

fn mac(key: &str, body: &[u8], t: i64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key_body(key).as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    mac.update(t.to_string().as_bytes());
    mac
}

/// The `X-Inngest-Signature` value for `body` at unix time `t`.
pub(crate) fn signature(key: &str, body: &[u8], t: i64) -> String {
    format!("t={t}&s={}", hex::encode(mac(key, body, t).finalize().into_bytes()))
}

/// Whether `header` signs `body` with one of `keys`, within the tolerance of `now`.
pub(crate) fn verify(keys: &[&str], header: &str, body: &[u8], now: i64) -> Result<(), &'static str> {
    let (mut t, mut s) = (None, None);
    for pair in header.split('&') {
        match pair.split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("s", v)) => s = hex::decode(v).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(s)) = (t, s) else { return Err("malformed signature") };
    if (now - t).abs() > TOLERANCE_SECS {
        return Err("signature outside the time window");
    }
    let signed_by = |key: &&str| bool::from(mac(key, body, t).finalize().into_bytes().as_slice().ct_eq(&s));
    if keys.iter().any(signed_by) { Ok(()) } else { Err("signature does not match") }
}

/// Whether an `Authorization: Bearer` value is one of `keys` as the SDKs send it: the key, or
/// the hex SHA-256 of the bytes its hex text encodes, each with or without the `signkey-<env>-`
/// prefix (the JS SDK keeps it, the Python SDK drops it).
pub(crate) fn bearer_matches(keys: &[&str], bearer: &str) -> bool {
    let given = key_body(bearer.trim());
    keys.iter().any(|key| {
        let body = key_body(key);
        let hashed = hex::decode(body).map(|raw| hex::encode(Sha256::digest(raw))).ok();
        bool::from(given.as_bytes().ct_eq(body.as_bytes()))
            || hashed.is_some_and(|h| bool::from(given.as_bytes().ct_eq(h.as_bytes())))
    })
}

/// A new random signing key, `signkey-test-<64 hex>`.
pub(crate) fn random_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("signkey-test-{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_with_its_key_and_nothing_else() {
        let key = "signkey-test-0011aabb";
        let header = signature(key, b"{\"a\":1}", 1_700_000_000);
        assert_eq!(verify(&[key], &header, b"{\"a\":1}", 1_700_000_010), Ok(()));
        assert!(verify(&["signkey-test-0011aabc"], &header, b"{\"a\":1}", 1_700_000_010).is_err());
        assert!(verify(&[key], &header, b"{\"a\":2}", 1_700_000_010).is_err(), "a changed body");
        assert!(verify(&[key], &header, b"{\"a\":1}", 1_700_000_400).is_err(), "a stale timestamp");
        // The prefix is not part of the MAC's key: the same key under another environment's name.
        assert_eq!(verify(&["signkey-prod-0011aabb"], &header, b"{\"a\":1}", 1_700_000_000), Ok(()));
    }

    #[test]
    fn a_bearer_is_the_key_or_its_hash_with_or_without_the_prefix() {
        let key = "signkey-test-00ff";
        let hashed = hex::encode(Sha256::digest([0x00, 0xff]));
        for bearer in ["signkey-test-00ff", "00ff", &format!("signkey-test-{hashed}"), &hashed] {
            assert!(bearer_matches(&[key], bearer), "{bearer}");
        }
        assert!(!bearer_matches(&[key], "00fe"));
        assert!(!bearer_matches(&[key], ""));
    }
}
