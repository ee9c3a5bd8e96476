//! SharedKey authorization for the Queue service, as a per-try policy of the Azure SDK's
//! pipeline: the official client signs only with Entra ID tokens.
//!
//! The string to sign is Microsoft's "Authorize with Shared Key" layout: the verb, eleven standard
//! headers (Content-Length empty when 0; `Date` left empty, `x-ms-date` carries the time), the
//! `x-ms-` headers sorted, then `/account/path` and the query parameters, names lower-cased and
//! sorted, values decoded.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request, Url};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};

/// Signs every try of every request with the account's key.
pub(crate) struct SharedKey {
    account: String,
    key: Vec<u8>,
}

// The key is a secret: never printed.
impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKey").field("account", &self.account).finish_non_exhaustive()
    }
}

impl SharedKey {
    pub(crate) fn new(account: String, key: Vec<u8>) -> Self {
        Self { account, key }
    }

    /// `base64(HMAC-SHA256(key, string_to_sign))`.
    pub(crate) fn sign(&self, string_to_sign: &str) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(string_to_sign.as_bytes());
        STANDARD.encode(mac.finalize().into_bytes())
    }
}

/// The string a request's SharedKey signature covers. `headers` are (lower-case name, value).
pub(crate) fn string_to_sign<'a>(
    account: &str,
    method: &str,
    url: &Url,
    headers: impl Iterator<Item = (&'a str, &'a str)>,
    content_length: Option<u64>,
) -> String {
    let headers: Vec<(&str, &str)> = headers.collect();
    let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| *v);
    let length = match content_length {
        Some(0) | None => String::new(),
        Some(n) => n.to_string(),
    };
    let mut out = String::new();
    for line in [
        method,
        header("content-encoding"),
        header("content-language"),
        &length,
        header("content-md5"),
        header("content-type"),
        "", // Date: x-ms-date is sent instead
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    ] {
        out.push_str(line);
        out.push('\n');
    }
    let ms: BTreeMap<&str, &str> = headers.iter().filter(|(n, _)| n.starts_with("x-ms-")).copied().collect();
    for (name, value) in ms {
        out.push_str(name);
        out.push(':');
        out.push_str(value.trim());
        out.push('\n');
    }
    out.push('/');
    out.push_str(account);
    out.push_str(url.path());
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in url.query_pairs() {
        params.entry(name.to_lowercase()).or_default().push(value.into_owned());
    }
    for (name, mut values) in params {
        values.sort();
        out.push('\n');
        out.push_str(&name);
        out.push(':');
        out.push_str(&values.join(","));
    }
    out
}

#[async_trait]
impl Policy for SharedKey {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        let date = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        request.insert_header("x-ms-date", date);
        let to_sign = string_to_sign(
            &self.account,
            request.method().as_str(),
            request.url(),
            request.headers().iter().map(|(n, v)| (n.as_str(), v.as_str())),
            request.body().len(),
        );
        request.insert_header("authorization", format!("SharedKey {}:{}", self.account, self.sign(&to_sign)));
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_to_sign_follows_the_shared_key_layout() {
        // Azurite's path-style URL: the account is in the path too, so it appears twice.
        let url =
            Url::parse("http://127.0.0.1:10001/devstoreaccount1/jobs/messages?visibilitytimeout=30&numofmessages=32")
                .unwrap();
        let headers = [
            ("x-ms-version", "2025-11-05"),
            ("x-ms-date", "Mon, 30 Nov 2026 10:00:00 GMT"),
            ("x-ms-client-request-id", "abc"),
            ("accept", "application/xml"),
        ];
        let text = string_to_sign("devstoreaccount1", "GET", &url, headers.into_iter(), Some(0));
        let expected = "GET\n\n\n\n\n\n\n\n\n\n\n\n\
            x-ms-client-request-id:abc\nx-ms-date:Mon, 30 Nov 2026 10:00:00 GMT\nx-ms-version:2025-11-05\n\
            /devstoreaccount1/devstoreaccount1/jobs/messages\nnumofmessages:32\nvisibilitytimeout:30";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_body_and_its_type_are_signed_and_query_values_decoded() {
        let url = Url::parse(
            "https://acct.queue.core.windows.net/q/messages/m1?popreceipt=AgAA%2Bx%2F%3D&visibilitytimeout=0",
        )
        .unwrap();
        let headers = [("content-type", "application/xml"), ("x-ms-version", "2025-11-05")];
        let text = string_to_sign("acct", "PUT", &url, headers.into_iter(), Some(57));
        assert!(text.starts_with("PUT\n\n\n57\n\napplication/xml\n\n"), "{text:?}");
        assert!(text.ends_with("/acct/q/messages/m1\npopreceipt:AgAA+x/=\nvisibilitytimeout:0"), "{text:?}");
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_string_in_base64() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let key = SharedKey::new("a".into(), b"Jefe".to_vec());
        let expected = STANDARD.encode(hex_bytes("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
        assert_eq!(key.sign("what do ya want for nothing?"), expected);
        assert!(!format!("{key:?}").contains("Jefe"), "the key is never printed");
    }

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }
}
