//! AWS SDK errors mapped onto redrive's error kinds, in one place.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use redrive_core::{Error, ErrorKind, Retry};

/// Maps an SDK error from `what`: throttling, timeouts, dispatch failures and 5xx are
/// temporary; a stale receipt handle is `LeaseLost`; a missing queue `NotFound`; the rest
/// permanent. Messages name the operation and the error code, never a receipt handle or body.
pub(crate) fn sdk<E, R>(e: SdkError<E, R>, what: &str) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let (kind, retry, message) = describe(&e, what);
    Error::new(kind, message).with_retry(retry).with_source(e)
}

fn describe<E, R>(e: &SdkError<E, R>, what: &str) -> (ErrorKind, Retry, String)
where
    E: ProvideErrorMetadata,
{
    let (kind, retry) = match e {
        SdkError::ServiceError(service) => classify(service.err().code()),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            (ErrorKind::Backend, Retry::Temporary)
        }
        _ => (ErrorKind::Backend, Retry::Permanent),
    };
    let code = e.code().unwrap_or("no code");
    (kind, retry, format!("sqs: {what} ({code})"))
}

pub(crate) fn classify(code: Option<&str>) -> (ErrorKind, Retry) {
    match code.unwrap_or_default() {
        "ReceiptHandleIsInvalid" | "InvalidReceiptHandle" | "MessageNotInflight" => {
            (ErrorKind::LeaseLost, Retry::Permanent)
        }
        "AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist" => (ErrorKind::NotFound, Retry::Permanent),
        "RequestThrottled"
        | "ThrottlingException"
        | "KmsThrottled"
        | "ServiceUnavailable"
        | "InternalError"
        | "InternalFailure" => (ErrorKind::Backend, Retry::Temporary),
        "InvalidMessageContents" => (ErrorKind::Decode, Retry::Permanent),
        _ => (ErrorKind::Backend, Retry::Permanent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_error_codes_map_to_kinds() {
        assert_eq!(classify(Some("ReceiptHandleIsInvalid")).0, ErrorKind::LeaseLost);
        assert_eq!(classify(Some("AWS.SimpleQueueService.NonExistentQueue")).0, ErrorKind::NotFound);
        assert_eq!(classify(Some("RequestThrottled")).1, redrive_core::Retry::Temporary);
    }
}
