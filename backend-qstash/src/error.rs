//! QStash's answers and transport failures mapped onto redrive's error kinds, in one place:
//! messages carry QStash's reason, never the token, the destination's URL or a body.

use std::time::Duration;

use redrive_core::{Error, ErrorKind, Retry};
use reqwest::{Response, StatusCode};
use serde_json::Value;

/// The error for a QStash answer that is not 2xx: its status as a kind and retry flag, QStash's
/// reason (cut short), and for 429 when to try again.
pub(crate) async fn refusal(what: &str, response: Response) -> Error {
    let status = response.status();
    let wait = retry_after(&response);
    let reason = response
        .json::<Value>()
        .await
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(|s| redrive_core::kit::broker::cut(s, 200).to_owned()))
        .unwrap_or_default();
    let reason = if reason.is_empty() { String::new() } else { format!(": {reason}") };
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::new(
            ErrorKind::Config,
            format!("QStash {what}: QStash refused the token ({status}){reason}; check QSTASH_TOKEN"),
        ),
        StatusCode::NOT_FOUND => Error::new(ErrorKind::NotFound, format!("QStash {what}: not found{reason}")),
        StatusCode::PAYLOAD_TOO_LARGE => Error::new(
            ErrorKind::PayloadTooLarge,
            format!("QStash {what}: the message is over the plan's size{reason}"),
        ),
        StatusCode::REQUEST_TIMEOUT => Error::temporary(format!("QStash {what}: timed out (408){reason}")),
        StatusCode::PRECONDITION_FAILED => Error::new(
            ErrorKind::Backend,
            format!("QStash {what}: the plan's quota is used up (412){reason}; nothing was sent"),
        )
        .with_retry(Retry::Permanent),
        StatusCode::TOO_MANY_REQUESTS => {
            let wait = wait.map(|w| format!("; try again in {} s", w.as_secs().max(1))).unwrap_or_default();
            Error::temporary(format!("QStash {what}: rate limited (429){reason}{wait}"))
        }
        s if s.is_server_error() => Error::temporary(format!("QStash {what}: {s}{reason}")),
        s => {
            Error::new(ErrorKind::Backend, format!("QStash {what}: refused ({s}){reason}")).with_retry(Retry::Permanent)
        }
    }
}

/// When QStash says to come back: `Retry-After` (seconds), or the reset of whichever rate limit
/// ran out (`Burst-RateLimit-Reset`, `RateLimit-Reset`: unix seconds).
fn retry_after(response: &Response) -> Option<Duration> {
    let header =
        |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(seconds) = header("retry-after") {
        return Some(Duration::from_secs(seconds));
    }
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    ["burst-ratelimit-reset", "ratelimit-reset"]
        .iter()
        .filter_map(|name| header(name))
        .map(|reset| Duration::from_secs(reset.saturating_sub(now)))
        .max()
}

/// A transport error's cause, without the URL (which carries the destination in its path).
pub(crate) fn cause(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_decode() || e.is_body() {
        "a broken answer"
    } else {
        "the request failed"
    }
}
