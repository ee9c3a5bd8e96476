//! Inngest's answers and transport failures mapped onto redrive's error kinds, in one place:
//! messages carry Inngest's reason, never a key or a body.

use redrive_core::{Error, ErrorKind, Retry};
use reqwest::{Response, StatusCode};
use serde_json::Value;

/// The error for an answer that is not 2xx: its status as a kind and retry flag, and Inngest's
/// reason, cut short.
pub(crate) async fn refusal(what: &str, response: Response) -> Error {
    let status = response.status();
    let reason = response
        .json::<Value>()
        .await
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(|s| redrive_core::kit::broker::cut(s, 200).to_owned()))
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::new(
            ErrorKind::Config,
            format!(
                "Inngest {what}: the key was refused ({status}){reason}; check INNGEST_EVENT_KEY and INNGEST_SIGNING_KEY"
            ),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => {
            Error::new(ErrorKind::PayloadTooLarge, format!("Inngest {what}: the event is over the plan's size{reason}"))
        }
        StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT => {
            Error::temporary(format!("Inngest {what}: {status}{reason}"))
        }
        s if s.is_server_error() => Error::temporary(format!("Inngest {what}: {s}{reason}")),
        s => Error::new(ErrorKind::Backend, format!("Inngest {what}: refused ({s}){reason}"))
            .with_retry(Retry::Permanent),
    }
}

/// A transport failure, without the URL.
pub(crate) fn transport(what: &str, e: &reqwest::Error) -> Error {
    let cause = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_decode() || e.is_body() {
        "a broken answer"
    } else {
        "the request failed"
    };
    Error::temporary(format!("Inngest {what}: {cause}"))
}
