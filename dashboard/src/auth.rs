//! Who may look and act: a token when the dashboard is reachable beyond loopback, a session
//! cookie once it was given, and a CSRF token on every form.
//!
//! CSRF is the double-submit pattern: a random value in an `HttpOnly`, `SameSite=Strict` cookie,
//! repeated in each form's hidden field, and a refusal of cross-site `Sec-Fetch-Site` and foreign
//! `Origin` headers. A page on another site can neither read the cookie nor send it.
//!
//! Wrong tokens (at sign-in, or as a bearer token) are throttled: [`PER_CLIENT`] per client
//! address and [`IN_ALL`] in all per [`WINDOW`], then 429 with `Retry-After`, the right token
//! included, until the window ends. Sessions live in this process's memory: a sign-out ends one,
//! "sign out everywhere" ends them all, and a restart (which is how the token changes) too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Extension, Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use rand::Rng;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::pages::{frame, problem, render};
use crate::{App, Csrf, Records, views};

pub(crate) const CSRF_COOKIE: &str = "redrive_csrf";
pub(crate) const SESSION_COOKIE: &str = "redrive_session";

/// How long a sign-in lasts.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Wrong tokens one client address may send per window.
pub(crate) const PER_CLIENT: u32 = 5;
/// Wrong tokens all clients together may send per window: guessing stays slow from many addresses.
pub(crate) const IN_ALL: u32 = 20;
/// The throttle's window.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// Client addresses the throttle tracks at most; past it a new address counts in all only.
const CLIENTS: usize = 10_000;

/// 256 random bits, hex.
pub(crate) fn random_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The address a request came from, when the server knows it ([`crate::Dashboard::serve`]
/// does; a router mounted without connect info does not, and then only [`IN_ALL`] applies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Client(pub(crate) Option<IpAddr>);

/// How the dashboard knows a request reached it over https.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Https {
    /// The public URL operators open is `https://` (TLS at a proxy in front).
    pub(crate) always: bool,
    /// The operator said the proxy in front sets `X-Forwarded-Proto` on every request.
    pub(crate) forwarded: bool,
}

/// What a sign-in came to.
pub(crate) enum SignIn {
    Session(Cookie<'static>),
    Wrong,
    Throttled(Duration),
}

pub(crate) struct Auth {
    token: Option<String>,
    https: Https,
    sessions: Mutex<HashMap<String, Instant>>,
    throttle: Throttle,
}

impl Auth {
    pub(crate) fn new(token: Option<String>, https: Https) -> Self {
        Self { token, https, sessions: Mutex::default(), throttle: Throttle::new() }
    }

    pub(crate) fn required(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `request` reached the dashboard over https, so that its cookies are `Secure`.
    /// `X-Forwarded-Proto` only when the operator said the proxy sets it: a client can send it.
    pub(crate) fn https(&self, headers: &HeaderMap) -> bool {
        let forwarded = || {
            let proto = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).unwrap_or_default();
            // The last value is the one the nearest proxy, ours, added.
            proto.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("https"))
        };
        self.https.always || (self.https.forwarded && forwarded())
    }

    /// Whether the request comes from an operator: no token is configured (loopback only), or
    /// it carries the token as a bearer header (a scraper), or a live session cookie. `Err`: a
    /// bearer token from a client that sent too many wrong ones; the time to wait.
    pub(crate) fn admits(&self, headers: &HeaderMap, jar: &CookieJar, client: Client) -> Result<bool, Duration> {
        let Some(token) = &self.token else { return Ok(true) };
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if let Some(given) = bearer {
            return self.check(token, given, client);
        }
        let Some(session) = jar.get(SESSION_COOKIE) else { return Ok(false) };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, started| started.elapsed() < SESSION_LIFETIME);
        Ok(sessions.keys().any(|id| same(id, session.value())))
    }

    /// Whether `given` is the token, unless `client` is throttled (`Err`: the time to wait); a
    /// wrong one counts against it.
    fn check(&self, token: &str, given: &str, client: Client) -> Result<bool, Duration> {
        if let Some(wait) = self.throttle.wait(client.0) {
            return Err(wait);
        }
        if same(given, token) {
            return Ok(true);
        }
        self.throttle.fail(client.0);
        tracing::warn!(client = ?client.0, "the dashboard refused a wrong token");
        Ok(false)
    }

    /// Starts a session if `given` is the token: the cookie to set.
    pub(crate) fn sign_in(&self, given: &str, client: Client, https: bool) -> SignIn {
        let Some(token) = &self.token else { return SignIn::Wrong };
        match self.check(token, given, client) {
            Ok(true) => {
                let id = random_token();
                self.sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), Instant::now());
                SignIn::Session(strict_cookie(SESSION_COOKIE, id, https))
            }
            Ok(false) => SignIn::Wrong,
            Err(wait) => SignIn::Throttled(wait),
        }
    }

    /// Ends the session of this browser.
    fn sign_out(&self, jar: &CookieJar) {
        if let Some(session) = jar.get(SESSION_COOKIE) {
            self.sessions.lock().unwrap_or_else(|e| e.into_inner()).retain(|id, _| !same(id, session.value()));
        }
    }

    /// Ends every session: how many there were.
    fn revoke_all(&self) -> usize {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let n = sessions.len();
        sessions.clear();
        n
    }
}

/// Wrong tries in one window.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    failures: u32,
}

impl Window {
    fn new(now: Instant) -> Self {
        Self { start: now, failures: 0 }
    }

    fn over(&self, now: Instant) -> bool {
        now.duration_since(self.start) >= WINDOW
    }

    /// The time to wait before another try, if `limit` wrong tries are spent.
    fn wait(&self, limit: u32, now: Instant) -> Option<Duration> {
        (!self.over(now) && self.failures >= limit).then(|| WINDOW - now.duration_since(self.start))
    }

    fn fail(&mut self, now: Instant) {
        if self.over(now) {
            *self = Self::new(now);
        }
        self.failures += 1;
    }
}

/// Fixed windows of wrong tries: per client address (at most [`CLIENTS`] of them) and in all.
struct Throttle {
    windows: Mutex<(Window, HashMap<IpAddr, Window>)>,
}

impl Throttle {
    fn new() -> Self {
        Self { windows: Mutex::new((Window::new(Instant::now()), HashMap::new())) }
    }

    fn wait(&self, client: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mine = client.and_then(|ip| windows.1.get(&ip)).and_then(|w| w.wait(PER_CLIENT, now));
        mine.max(windows.0.wait(IN_ALL, now))
    }

    fn fail(&self, client: Option<IpAddr>) {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (all, clients) = &mut *windows;
        all.fail(now);
        let Some(ip) = client else { return };
        if clients.len() >= CLIENTS && !clients.contains_key(&ip) {
            clients.retain(|_, w| !w.over(now));
        }
        if clients.len() < CLIENTS || clients.contains_key(&ip) {
            clients.entry(ip).or_insert_with(|| Window::new(now)).fail(now);
        }
    }
}

/// 429 with `Retry-After`, for a client that sent too many wrong tokens.
pub(crate) fn throttled(wait: Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response =
        (StatusCode::TOO_MANY_REQUESTS, format!("too many wrong tokens: try again in {seconds} s\n")).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

pub(crate) fn strict_cookie(name: &'static str, value: String, secure: bool) -> Cookie<'static> {
    Cookie::build((name, value)).http_only(true).secure(secure).same_site(SameSite::Strict).path("/").build()
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

pub(crate) async fn sign_out_page<B: Records>(
    State(app): State<Arc<App<B>>>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    if !app.auth.required() {
        return Redirect::to("/").into_response();
    }
    render(StatusCode::OK, views::SignOut { frame: frame("Sign out"), csrf: csrf.0 })
}

#[derive(Debug, Deserialize)]
pub(crate) struct SignOutForm {
    #[serde(default)]
    csrf: String,
    /// Any value: sign out every browser, not only this one.
    #[serde(default)]
    everywhere: String,
}

pub(crate) async fn sign_out<B: Records>(
    State(app): State<Arc<App<B>>>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<SignOutForm>,
) -> Response {
    if let Some(why) = csrf_refusal(&headers, &jar, &form.csrf) {
        return problem(StatusCode::FORBIDDEN, format!("Refused {why}."));
    }
    if form.everywhere.is_empty() {
        app.auth.sign_out(&jar);
        tracing::info!("signed out of the dashboard");
    } else {
        let sessions = app.auth.revoke_all();
        tracing::warn!(sessions, "every dashboard session revoked");
    }
    let jar = jar.remove(Cookie::build(SESSION_COOKIE).path("/"));
    (jar, Redirect::to("/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_tracks_a_bounded_number_of_addresses_and_still_limits_them_in_all() {
        let throttle = Throttle::new();
        for n in 0..CLIENTS as u32 + 100 {
            throttle.fail(Some(IpAddr::from(n.to_be_bytes())));
        }
        let windows = throttle.windows.lock().unwrap();
        assert_eq!(windows.1.len(), CLIENTS, "no more addresses than the bound");
        drop(windows);
        assert!(throttle.wait(Some(IpAddr::from([10, 9, 8, 7]))).is_some(), "the overall limit holds");
    }
}
