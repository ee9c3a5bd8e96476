//! Azure SDK errors mapped onto redrive's error kinds, in one place.

use azure_core::error::ErrorKind as AzureKind;
use redrive_core::{Error, ErrorKind, Retry};

/// Maps an SDK error from `what`: a stale pop receipt is `LeaseLost`; a missing queue
/// `NotFound`; a refused signature `Config` (a wrong key, at start); throttling, timeouts,
/// connection failures, tokens not fetched and 5xx are temporary; the rest permanent. Messages
/// name the operation, the status and Azure's error code, never a pop receipt, a message text or
/// the key.
pub(crate) fn azure(e: azure_core::Error, what: &str) -> Error {
    let (kind, retry, code) = match e.kind() {
        AzureKind::HttpResponse { status, error_code, .. } => {
            let status = u16::from(*status);
            let code = error_code.clone().unwrap_or_default();
            let (kind, retry) = classify(status, &code);
            (kind, retry, format!("{status} {code}"))
        }
        AzureKind::Io | AzureKind::Connection => (ErrorKind::Backend, Retry::Temporary, "no answer".to_owned()),
        // A token that could not be fetched (an identity endpoint down) may come next time.
        AzureKind::Credential => (ErrorKind::Backend, Retry::Temporary, "no token".to_owned()),
        _ => (ErrorKind::Backend, Retry::Permanent, "client error".to_owned()),
    };
    let hint = match kind {
        ErrorKind::Config => ": check the account name and its key or credential",
        _ => "",
    };
    // No source: Azure's error body can echo the string it signed, pop receipt included.
    drop(e);
    Error::new(kind, format!("azure: {what} ({}){hint}", code.trim())).with_retry(retry)
}

pub(crate) fn classify(status: u16, code: &str) -> (ErrorKind, Retry) {
    match (status, code) {
        (_, "PopReceiptMismatch" | "MessageNotFound") => (ErrorKind::LeaseLost, Retry::Permanent),
        (_, "QueueNotFound") | (404, _) => (ErrorKind::NotFound, Retry::Permanent),
        (401 | 403, _) => (ErrorKind::Config, Retry::Permanent),
        (_, "MessageTooLarge" | "RequestBodyTooLarge") | (413, _) => (ErrorKind::PayloadTooLarge, Retry::Permanent),
        (_, "InvalidResourceName" | "OutOfRangeInput") => (ErrorKind::InvalidName, Retry::Permanent),
        (408 | 429 | 500..=599, _) => (ErrorKind::Backend, Retry::Temporary),
        _ => (ErrorKind::Backend, Retry::Permanent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_error_codes_map_to_kinds() {
        assert_eq!(classify(400, "PopReceiptMismatch").0, ErrorKind::LeaseLost);
        assert_eq!(classify(404, "MessageNotFound").0, ErrorKind::LeaseLost);
        assert_eq!(classify(404, "QueueNotFound").0, ErrorKind::NotFound);
        assert_eq!(classify(403, "AuthorizationFailure"), (ErrorKind::Config, Retry::Permanent));
        assert_eq!(classify(503, "ServerBusy").1, Retry::Temporary);
        assert_eq!(classify(400, "InvalidQueryParameterValue").1, Retry::Permanent);
    }
}
