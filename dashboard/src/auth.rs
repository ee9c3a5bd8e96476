//! Who may look and act: a token when the dashboard is reachable beyond loopback, a session
//! cookie once it was given, and a CSRF token on every form.
//!
//! CSRF is the double-submit pattern: a random value in an `HttpOnly`, `SameSite=Strict` cookie,
//! repeated in each form's hidden field, and a refusal of cross-site `Sec-Fetch-Site` and foreign
//! `Origin` headers. A page on another site can neither read the cookie nor send it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use rand::Rng;
use subtle::ConstantTimeEq;

pub(crate) const CSRF_COOKIE: &str = "redrive_csrf";
pub(crate) const SESSION_COOKIE: &str = "redrive_session";

/// How long a sign-in lasts.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// 256 random bits, hex.
pub(crate) fn random_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

pub(crate) struct Auth {
    token: Option<String>,
    sessions: Mutex<HashMap<String, Instant>>,
}

impl Auth {
    pub(crate) fn new(token: Option<String>) -> Self {
        Self { token, sessions: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn required(&self) -> bool {
        self.token.is_some()
    }

    /// Whether the request comes from an operator: no token is configured (loopback only), or
    /// it carries the token as a bearer header (a scraper), or a live session cookie.
    pub(crate) fn admits(&self, headers: &HeaderMap, jar: &CookieJar) -> bool {
        let Some(token) = &self.token else { return true };
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|given| same(given, token)) {
            return true;
        }
        let Some(session) = jar.get(SESSION_COOKIE) else { return false };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, started| started.elapsed() < SESSION_LIFETIME);
        sessions.keys().any(|id| same(id, session.value()))
    }

    /// Starts a session if `given` is the token; the cookie to set.
    pub(crate) fn sign_in(&self, given: &str) -> Option<Cookie<'static>> {
        let token = self.token.as_ref()?;
        if !same(given, token) {
            return None;
        }
        let id = random_token();
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), Instant::now());
        Some(strict_cookie(SESSION_COOKIE, id))
    }
}

pub(crate) fn strict_cookie(name: &'static str, value: String) -> Cookie<'static> {
    Cookie::build((name, value)).http_only(true).same_site(SameSite::Strict).path("/").build()
}

/// Why a form post is refused, if it is: a missing or wrong CSRF field, or a cross-site origin.
pub(crate) fn csrf_refusal(headers: &HeaderMap, jar: &CookieJar, field: &str) -> Option<&'static str> {
    if headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes() == b"cross-site") {
        return Some("a cross-site form post");
    }
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let origin = origin.to_str().unwrap_or_default();
        let host = host.to_str().unwrap_or_default();
        let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if origin_host != host {
            return Some("a form post from another origin");
        }
    }
    match jar.get(CSRF_COOKIE) {
        Some(cookie) if !field.is_empty() && same(cookie.value(), field) => None,
        _ => Some("a form post without this dashboard's CSRF token (reload the page and try again)"),
    }
}
