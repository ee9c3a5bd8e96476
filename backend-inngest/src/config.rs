//! The backend's settings.

use std::fmt;
use std::time::Duration;

use redrive_core::{Error, ErrorKind, Result};

/// How to reach Inngest, and how the serve endpoint checks what it calls with.
#[derive(Clone)]
pub struct InngestConfig {
    pub(crate) event_key: String,
    pub(crate) signing_key: String,
    pub(crate) signing_key_fallback: Option<String>,
    pub(crate) serve_url: String,
    pub(crate) app_id: String,
    pub(crate) api_url: String,
    pub(crate) event_api_url: String,
    pub(crate) call_timeout: Duration,
    pub(crate) park_limit: Duration,
    pub(crate) max_parked: usize,
    pub(crate) leeway: Duration,
    pub(crate) max_event: usize,
    pub(crate) retries: u32,
    pub(crate) unclaimed_rounds: u32,
    pub(crate) max_steps: usize,
    pub(crate) plain_http: bool,
}

impl fmt::Debug for InngestConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InngestConfig")
            .field("app_id", &self.app_id)
            .field("api_url", &self.api_url)
            .field("event_api_url", &self.event_api_url)
            .field("call_timeout", &self.call_timeout)
            .field("max_parked", &self.max_parked)
            .field("max_event", &self.max_event)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// Inngest's API and event API.
const API_URL: &str = "https://api.inngest.com";
const EVENT_API_URL: &str = "https://inn.gs";
/// The steps a run keeps free: past them, it continues as a new run.
pub(crate) const STEP_RESERVE: usize = 10;
/// The most retries Inngest allows a function.
pub(crate) const MAX_RETRIES: u32 = 20;

impl InngestConfig {
    /// A backend sending events with `event_key`, whose serve endpoint
    /// ([`InngestBackend::endpoint`](crate::InngestBackend::endpoint)) is mounted at `serve_url`
    /// (https) and checks calls with `signing_key` (`signkey-<env>-<hex>`, from Inngest's
    /// dashboard). App `redrive`, queue `jobs`.
    pub fn new(event_key: impl Into<String>, signing_key: impl Into<String>, serve_url: impl Into<String>) -> Self {
        Self {
            event_key: event_key.into(),
            signing_key: signing_key.into(),
            signing_key_fallback: None,
            serve_url: serve_url.into(),
            app_id: "redrive".into(),
            api_url: API_URL.into(),
            event_api_url: EVENT_API_URL.into(),
            call_timeout: Duration::from_secs(60),
            park_limit: Duration::from_secs(20),
            max_parked: 256,
            leeway: Duration::from_secs(300),
            max_event: 256 * 1024,
            retries: 4,
            unclaimed_rounds: 20,
            max_steps: 1_000,
            plain_http: false,
        }
    }

    /// The Inngest app (`redrive`): one serve endpoint, one queue. Its jobs are the events
    /// `redrive/<app>`, run by the function `<app>-jobs`, and its records are kept apart from
    /// other apps'. A sync replaces the app's functions, so two queues are two apps, each at its
    /// own endpoint.
    pub fn with_app_id(mut self, app_id: impl Into<String>) -> Self {
        self.app_id = app_id.into();
        self
    }

    /// Another Inngest, both APIs at one URL (the emulator, a self-hosted server).
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        let url = url.into().trim_end_matches('/').to_owned();
        self.event_api_url = url.clone();
        self.api_url = url;
        self
    }

    /// The signing key after a rotation's first step: calls signed with either are accepted.
    pub fn with_signing_key_fallback(mut self, key: impl Into<String>) -> Self {
        self.signing_key_fallback = Some(key.into());
        self
    }

    /// How long Inngest waits for the endpoint's answer to a call (60 s): a handler cannot hold
    /// its call longer, renewals stop there. Keep it within what Inngest and any proxy allow.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long a call waits for a worker of this process to claim it (20 s) before it is
    /// answered with a sleep of none, at no attempt's cost: Inngest calls again.
    pub fn with_park_limit(mut self, limit: Duration) -> Self {
        self.park_limit = limit;
        self
    }

    /// The most calls the endpoint holds open at once (256); past it a call is answered with a
    /// short sleep at no attempt's cost.
    pub fn with_max_parked(mut self, max: usize) -> Self {
        self.max_parked = max.max(1);
        self
    }

    /// How far a call's signature time may be from this machine's clock (5 minutes, as the SDKs).
    pub fn with_leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// The largest event Inngest takes on your plan (256 KiB).
    pub fn with_max_event(mut self, bytes: usize) -> Self {
        self.max_event = bytes;
        self
    }

    /// How many times Inngest calls again when a call gets no answer (a crash, a timeout), each
    /// an attempt of the job (4, at most 20). The worker's retries ride in the run's steps and do
    /// not use these.
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// How many times a call no worker of this process takes goes back before it becomes a
    /// record (20): a kind nothing here handles.
    pub fn with_unclaimed_rounds(mut self, rounds: u32) -> Self {
        self.unclaimed_rounds = rounds.max(1);
        self
    }

    /// The most steps Inngest allows a run (1,000). Each retry or deferral takes two (its mark
    /// and its sleep); a run whose next ones would come within ten of the limit continues as a
    /// new run of the same job, carrying its id, attempts and errors.
    pub fn with_max_steps(mut self, steps: usize) -> Self {
        self.max_steps = steps;
        self
    }

    /// Allows `http://` URLs (the emulator, tests); refused otherwise.
    pub fn allow_plain_http(mut self) -> Self {
        self.plain_http = true;
        self
    }

    /// The Inngest app: its function, events and records are this queue's.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// The events' name: `redrive/<app>`.
    pub(crate) fn event_name(&self) -> String {
        format!("redrive/{}", self.app_id)
    }

    /// The function that runs the app's jobs: `<app>-jobs`.
    pub(crate) fn function_id(&self) -> String {
        format!("{}-jobs", self.app_id)
    }

    /// Its failure handler: `<app>-jobs-failure`.
    pub(crate) fn failure_id(&self) -> String {
        format!("{}-failure", self.function_id())
    }

    pub(crate) fn check(&self) -> Result<()> {
        let config = |message: String| Err(Error::new(ErrorKind::Config, message));
        if self.event_key.trim().is_empty() {
            return config("Inngest: the event key is empty (INNGEST_EVENT_KEY)".into());
        }
        for (what, key) in std::iter::once(("signing key", &self.signing_key))
            .chain(self.signing_key_fallback.iter().map(|k| ("fallback signing key", k)))
        {
            let body = crate::signature::key_body(key);
            if body.is_empty() || hex::decode(body).is_err() {
                return config(format!(
                    "Inngest: the {what} is not `signkey-<env>-<hex>` (INNGEST_SIGNING_KEY); an empty key would accept forged calls"
                ));
            }
        }
        redrive_core::key::check_name("Inngest app id", &self.app_id)?;
        for (what, url) in
            [("serve URL", &self.serve_url), ("API URL", &self.api_url), ("event API URL", &self.event_api_url)]
        {
            let allowed = url.starts_with("https://") || (self.plain_http && url.starts_with("http://"));
            if !allowed {
                return config(format!("Inngest: the {what} must be https:// (allow_plain_http for local work)"));
            }
        }
        if self.serve_url.contains('?') {
            return config("Inngest: the serve URL takes no query: the functions' parameters go there".into());
        }
        if self.max_steps < 2 * STEP_RESERVE {
            return config(format!("Inngest: a run of {} steps leaves no room to continue it", self.max_steps));
        }
        if self.retries > MAX_RETRIES {
            return config(format!("Inngest: at most {MAX_RETRIES} retries, asked for {}", self.retries));
        }
        Ok(())
    }
}
