//! `QStashConfig::doctor`: the rules a QStash account and the workers' destination must hold (see
//! `redrive_core::doctor`), read without `QStashBackend::connect`, which stops at the first
//! thing wrong rather than report each.

use std::time::Duration;

use redrive_core::doctor::{Check, Expect};
use redrive_core::{Error, ErrorKind, Result};
use reqwest::StatusCode;

use crate::api::Api;
use crate::{QStashConfig, SigningKeys};

/// How long the destination has to answer the unsigned probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl QStashConfig {
    /// Checks the rules the account and the destination must hold: the plan's retries leave room
    /// for the largest cap; the token reads the DLQ (where a job at its cap goes, and where
    /// redrive takes its records from); the signing keys are there, and any given with
    /// [`Self::with_signing_keys`] are QStash's current ones; and the destination answers, refusing
    /// an unsigned request. Reads only: the probe carries no signature, so the receiver refuses it
    /// before it reads the body.
    pub async fn doctor(&self, expect: &Expect) -> Result<Vec<Check>> {
        self.check()?;
        let api = Api::new(&self.api_url, &self.token, Duration::from_secs(10))?;
        let dlq = api.dlq_page(&self.destination, None).await.map(|(entries, more)| (entries.len(), more.is_some()));
        Ok(vec![
            retries(expect.cap, self.max_retries),
            dlq_access(dlq),
            signing_keys(api.signing_keys().await, self.signing_keys.as_ref()),
            destination(probe(&self.destination).await),
        ])
    }
}

/// The jobs' largest cap against the plan's retries (`QStashConfig::with_max_retries`).
fn retries(cap: u32, plan: u32) -> Check {
    if cap.saturating_sub(1) > plan {
        Check::fail(
            "qstash.retries",
            format!(
                "a cap of {cap} needs {} retries; the plan allows {plan}, so such jobs are refused at enqueue",
                cap - 1
            ),
            format!(
                "lower the jobs' cap to {} or raise the plan's retries (`QStashConfig::with_max_retries`)",
                plan + 1
            ),
        )
    } else {
        Check::pass(
            "qstash.retries",
            format!("a cap of {cap} needs {} retries; the plan allows {plan}", cap.saturating_sub(1)),
        )
    }
}

fn dlq_access(dlq: Result<(usize, bool)>) -> Check {
    match dlq {
        Ok((entries, more)) => {
            let more = if more { " or more" } else { "" };
            Check::pass(
                "qstash.dlq-access",
                format!("the token reads the DLQ: {entries}{more} entries for the destination"),
            )
        }
        Err(e) if e.kind() == ErrorKind::Config => Check::fail(
            "qstash.dlq-access",
            "QStash refused the token the DLQ list: the workers cannot take failed jobs from it as records",
            "use a token that can read the DLQ (the account's QSTASH_TOKEN)",
        ),
        Err(e) => Check::fail(
            "qstash.dlq-access",
            format!("cannot read the DLQ: {e}"),
            "check QSTASH_URL and that QStash answers",
        ),
    }
}

fn signing_keys(fetched: Result<SigningKeys>, given: Option<&SigningKeys>) -> Check {
    let keys = match fetched {
        Ok(keys) => keys,
        Err(e) => {
            return Check::fail(
                "qstash.signing-keys",
                format!("cannot read the signing keys: {e}"),
                "use the account's QSTASH_TOKEN: the receiver reads the keys with it to check each delivery",
            );
        }
    };
    if keys.current.is_empty() || keys.next.is_empty() {
        return Check::fail(
            "qstash.signing-keys",
            "QStash gave an empty signing key",
            "roll the signing keys in the Upstash console",
        );
    }
    match given {
        None => {
            Check::pass("qstash.signing-keys", "current and next keys present; the receiver reads them from QStash")
        }
        Some(given) => {
            let known = [&keys.current, &keys.next];
            if !known.contains(&&given.current) && !known.contains(&&given.next) {
                Check::fail(
                    "qstash.signing-keys",
                    "the signing keys given are neither of QStash's: every delivery is refused (401) and retried until the DLQ",
                    "set QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY from the console, or give none so the receiver reads them",
                )
            } else {
                Check::warn(
                    "qstash.signing-keys",
                    "the signing keys are given by hand: they hold until the next rotation but one",
                    "give none (`QStashConfig` reads `/v2/keys` itself), or update them at each rotation",
                )
            }
        }
    }
}

/// What the destination answered to an unsigned, empty POST.
enum Probe {
    Answered(StatusCode, String),
    NoAnswer(String),
}

async fn probe(destination: &str) -> Probe {
    let client = match reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => return Probe::NoAnswer(Error::new(ErrorKind::Config, "no HTTP client").with_source(e).to_string()),
    };
    match client.post(destination).send().await {
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            Probe::Answered(status, redrive_core::kit::broker::cut(&body, 100).to_owned())
        }
        Err(e) => Probe::NoAnswer(crate::error::cause(&e).to_owned()),
    }
}

fn destination(probe: Probe) -> Check {
    const RULE: &str = "qstash.destination";
    match probe {
        Probe::Answered(StatusCode::UNAUTHORIZED, body) if body.contains("Upstash-Signature") => {
            Check::pass(RULE, "the destination answers and refuses an unsigned request, as the receiver does")
        }
        Probe::Answered(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _) => Check::warn(
            RULE,
            "the destination refuses an unsigned request, but not in the receiver's words: something in front of it answers",
            "make sure QStash's signed deliveries reach `QStashBackend::receiver` (a proxy or an auth layer may refuse them)",
        ),
        Probe::Answered(status, _) if status.is_success() => Check::fail(
            RULE,
            format!("the destination accepted an unsigned request ({status}): anyone can post jobs to it"),
            "mount `QStashBackend::receiver` there: it checks QStash's signature before anything else",
        ),
        Probe::Answered(status @ (StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED), _) => Check::fail(
            RULE,
            format!("nothing takes deliveries there ({status}): every job goes to the DLQ unrun"),
            "mount `QStashBackend::receiver` at the destination's path (axum: `.route(path, backend.receiver())`)",
        ),
        Probe::Answered(status, _) => Check::fail(
            RULE,
            format!("the destination answered {status} to a request the receiver refuses with 401"),
            "mount `QStashBackend::receiver` at the destination's path",
        ),
        Probe::NoAnswer(why) => Check::fail(
            RULE,
            format!("the destination does not answer from here ({why})"),
            "start the workers' receiver at the destination, and let QStash reach it (a public https URL)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::doctor::Status;

    #[test]
    fn a_cap_needs_its_retries() {
        assert_eq!(retries(6, 5).status, Status::Pass);
        assert_eq!(retries(7, 5).status, Status::Fail);
        assert_eq!(retries(7, 6).status, Status::Pass);
    }

    #[test]
    fn keys_given_by_hand_must_be_qstash_s() {
        let keys = || Ok(SigningKeys { current: "a".into(), next: "b".into() });
        let given = |c: &str, n: &str| SigningKeys { current: c.into(), next: n.into() };
        assert_eq!(signing_keys(keys(), None).status, Status::Pass);
        assert_eq!(signing_keys(keys(), Some(&given("b", "c"))).status, Status::Warn);
        assert_eq!(signing_keys(keys(), Some(&given("x", "y"))).status, Status::Fail);
    }

    #[test]
    fn an_open_or_missing_destination_fails() {
        let answered = |status, body: &str| destination(Probe::Answered(status, body.into())).status;
        assert_eq!(answered(StatusCode::UNAUTHORIZED, "no Upstash-Signature"), Status::Pass);
        assert_eq!(answered(StatusCode::UNAUTHORIZED, "login"), Status::Warn);
        assert_eq!(answered(StatusCode::OK, ""), Status::Fail);
        assert_eq!(answered(StatusCode::NOT_FOUND, ""), Status::Fail);
        assert_eq!(destination(Probe::NoAnswer("refused".into())).status, Status::Fail);
    }
}
