//! Inngest's request signatures, checked on the raw body before anything parses it, and the
//! endpoint's answers signed the same way.
//!
//! `X-Inngest-Signature: t=<unix seconds>&s=<hex HMAC-SHA256>`: the MAC is keyed with the signing
//! key's text after its `signkey-<env>-` prefix (the hex characters' bytes, as the SDKs key it),
//! over the body followed by the decimal timestamp. Inngest sends the body in canonical JSON, the
//! form it signed, so the bytes received are checked as they are.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The key text the MAC is keyed with: the signing key after its `signkey-<env>-` prefix.
pub(crate) fn key_body(key: &str) -> &str {
    match key.strip_prefix("signkey-") {
        Some(rest) => rest.split_once('-').map_or("", |(_, body)| body),
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
pub(crate) fn sign(key: &str, body: &[u8], t: i64) -> String {
    format!("t={t}&s={}", hex::encode(mac(key, body, t).finalize().into_bytes()))
}

/// Why a call is refused: no value of the request is named.
pub(crate) fn verify(
    keys: &[&str],
    header: Option<&str>,
    body: &[u8],
    now: i64,
    leeway: i64,
) -> Result<(), &'static str> {
    let header = header.ok_or("no X-Inngest-Signature")?;
    let (mut t, mut s) = (None, None);
    for pair in header.split('&') {
        match pair.split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("s", v)) => s = hex::decode(v).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(s)) = (t, s) else { return Err("a malformed X-Inngest-Signature") };
    if (now - t).abs() > leeway {
        return Err("the signature's time is outside the leeway (a replayed or delayed call, or a clock off)");
    }
    let signed = |key: &&str| bool::from(mac(key, body, t).finalize().into_bytes().as_slice().ct_eq(&s));
    if keys.iter().any(signed) { Ok(()) } else { Err("the signature does not match the signing keys") }
}

/// The bearer the API takes: the prefix kept, then the hex SHA-256 of the bytes the key's hex
/// encodes (as the JS SDK sends it). `check` has made sure the key is hex.
pub(crate) fn bearer(key: &str) -> String {
    let body = key_body(key);
    let prefix = &key[..key.len() - body.len()];
    let raw = hex::decode(body).unwrap_or_default();
    format!("{prefix}{}", hex::encode(Sha256::digest(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_verifies_with_either_key_and_is_refused_otherwise() {
        let (key, next) = ("signkey-prod-00aa", "signkey-prod-11bb");
        let signed = sign(next, b"{}", 1_000);
        assert_eq!(verify(&[key, next], Some(&signed), b"{}", 1_010, 300), Ok(()));
        assert!(verify(&[key], Some(&signed), b"{}", 1_010, 300).is_err(), "another key");
        assert!(verify(&[next], Some(&signed), b"{ }", 1_010, 300).is_err(), "a changed body");
        assert!(verify(&[next], Some(&signed), b"{}", 1_400, 300).is_err(), "a stale time");
        assert!(verify(&[next], None, b"{}", 1_000, 300).is_err(), "no header");
        assert!(verify(&[next], Some("t=1000"), b"{}", 1_000, 300).is_err(), "no MAC");
        assert_eq!(bearer("signkey-test-00ff"), format!("signkey-test-{}", hex::encode(Sha256::digest([0, 0xff]))));
        assert_eq!(key_body("signkey-test"), "", "a prefix without a key is no key");
    }
}
