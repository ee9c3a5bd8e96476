//! `InngestConfig::doctor`: the rules an Inngest app and the workers' endpoint must hold (see
//! `redrive_core::doctor`), read without `InngestBackend::connect` and without sending an event.

use std::time::Duration;

use redrive_core::doctor::{Check, Expect};
use redrive_core::{ErrorKind, Result};
use reqwest::StatusCode;
use serde_json::Value;

use crate::InngestConfig;
use crate::api::Api;

/// How long the endpoint has to answer the unsigned probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl InngestConfig {
    /// Checks the rules the app and its endpoint must hold: Inngest has the app's function and
    /// its failure handler registered (a run Inngest fails on its own becomes a record only
    /// through the handler), as this configuration registers them; the signing key reads them;
    /// the serve URL answers and refuses an unsigned call; the longest job fits in one call. (A
    /// run's 1,000 steps need no rule: a run near them continues as a new one.) Reads only: the
    /// probe carries no signature, so the endpoint refuses it before it reads the body.
    pub async fn doctor(&self, expect: &Expect) -> Result<Vec<Check>> {
        self.check()?;
        let api = Api::new(self)?;
        Ok(vec![
            functions(self, api.functions(&self.app_id).await),
            endpoint(probe(&self.serve_url).await),
            call_timeout(self, expect),
        ])
    }
}

/// The app's registration against this configuration's.
fn functions(config: &InngestConfig, listed: Result<Vec<Value>>) -> Check {
    const RULE: &str = "inngest.functions";
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) if e.kind() == ErrorKind::Config => {
            return Check::fail(
                RULE,
                "Inngest refused the signing key: the endpoint would refuse Inngest's calls too",
                "use the environment's signing key (INNGEST_SIGNING_KEY, from Inngest's dashboard)",
            );
        }
        Err(e) => {
            return Check::fail(
                RULE,
                format!("cannot read the app's functions: {e}"),
                "check INNGEST_BASE_URL and that Inngest answers",
            );
        }
    };
    let find = |id: &str| listed.iter().find(|f| f["id"] == id || f["slug"] == id);
    let (function, failure) = (config.function_id(), config.failure_id());
    let Some(jobs) = find(&function) else {
        return Check::fail(
            RULE,
            format!("app {:?} has no function {function:?}: Inngest runs none of its jobs", config.app_id),
            "sync the app: `InngestBackend::sync` at start-up, or Inngest's sync (a PUT to the endpoint)",
        );
    };
    if find(&failure).is_none() {
        return Check::fail(
            RULE,
            format!("{failure:?} is not registered: a run Inngest fails on its own leaves no record"),
            "sync the app again with this version of redrive-inngest",
        );
    }
    let event = config.event_name();
    let triggered = jobs["triggers"].as_array().is_some_and(|t| t.iter().any(|t| t["event"] == event.as_str()));
    if !triggered {
        return Check::fail(
            RULE,
            format!("{function:?} is not triggered by {event:?}: the jobs sent run nothing"),
            "sync the app again from the workers' configuration",
        );
    }
    match jobs["retries"].as_u64() {
        Some(retries) if retries != u64::from(config.retries) => Check::warn(
            RULE,
            format!(
                "{function:?} is registered with {retries} retries, this configuration says {}: another configuration synced it",
                config.retries
            ),
            "sync from the configuration the workers run with",
        ),
        _ => Check::pass(RULE, format!("{function:?} on {event:?} and its failure handler are registered")),
    }
}

/// What the endpoint answered to an unsigned, empty POST.
enum Probe {
    Answered(StatusCode, String),
    NoAnswer(&'static str),
}

async fn probe(serve_url: &str) -> Probe {
    let Ok(client) = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() else {
        return Probe::NoAnswer("no HTTP client");
    };
    match client.post(serve_url).send().await {
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            Probe::Answered(status, redrive_core::kit::broker::cut(&body, 200).to_owned())
        }
        Err(e) if e.is_timeout() => Probe::NoAnswer("timed out"),
        Err(_) => Probe::NoAnswer("could not connect"),
    }
}

fn endpoint(probe: Probe) -> Check {
    const RULE: &str = "inngest.endpoint";
    match probe {
        Probe::Answered(StatusCode::UNAUTHORIZED, body) if body.to_ascii_lowercase().contains("signature") => {
            Check::pass(RULE, "the serve URL answers and refuses an unsigned call, as the endpoint does")
        }
        Probe::Answered(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _) => Check::warn(
            RULE,
            "the serve URL refuses an unsigned call, but not as redrive's endpoint does (a proxy's refusal?)",
            "make sure the URL leads to `InngestBackend::endpoint` and that the proxy passes Inngest's calls",
        ),
        Probe::Answered(status, _) => Check::fail(
            RULE,
            format!("the serve URL answered an unsigned call with {status}: something else answers there"),
            "mount `InngestBackend::endpoint` at the serve URL's path",
        ),
        Probe::NoAnswer(why) => Check::fail(
            RULE,
            format!("the serve URL does not answer ({why}): Inngest cannot call the workers"),
            "start the workers' process, or route the serve URL to it",
        ),
    }
}

/// The longest job against one call: a job holds its call open, and a call past Inngest's wait
/// is called again, an attempt spent.
fn call_timeout(config: &InngestConfig, expect: &Expect) -> Check {
    const RULE: &str = "inngest.call-timeout";
    let (longest, what) = match expect.job_timeout {
        Some(timeout) => (timeout, "the longest job"),
        None => (expect.lease, "the lease (no job timeout given)"),
    };
    let fits = config.call_timeout.saturating_sub((config.call_timeout / 10).min(Duration::from_secs(5)));
    let (longest_s, fits_s) = (longest.as_secs_f64(), fits.as_secs_f64());
    if longest > fits {
        Check::fail(
            RULE,
            format!(
                "{what}, {longest_s} s, outlives a call ({fits_s} s answered in): Inngest calls again, an attempt each"
            ),
            "raise `InngestConfig::with_call_timeout` (as far as Inngest and any proxy wait), or split the job",
        )
    } else {
        Check::pass(RULE, format!("{what}, {longest_s} s, fits in a call ({fits_s} s answered in)"))
    }
}
