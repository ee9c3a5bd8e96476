//! The one error type of redrive: a kind, a retry flag and a message.

use std::fmt;
use std::sync::Arc;

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The idempotency key already belongs to a job with a different payload.
    KeyConflict,
    /// The payload is larger than the backend accepts.
    PayloadTooLarge,
    /// The lease (lease token, receipt handle, pop receipt) is no longer the job's current one.
    LeaseLost,
    /// The job or failure record does not exist.
    NotFound,
    /// A queue, schema, kind or fact name is not valid for the backend.
    InvalidName,
    /// An idempotency key could not be built (no facts, an empty value, a duplicate name).
    InvalidKey,
    /// A payload or message does not decode.
    Decode,
    /// An argument the call cannot act on: a discard without a reason, a replay or discard
    /// without an actor.
    InvalidInput,
    /// A configuration that would lose data or cannot work, refused at start-up.
    Config,
    /// The backend (database, broker, HTTP API) failed.
    Backend,
    /// The payload holds what the backend cannot store or send as it is (a NUL character in
    /// PostgreSQL's `jsonb`), refused before anything is sent rather than changed.
    InvalidPayload,
    /// The backend cannot do this: a broker cannot list or cancel the jobs it holds.
    Unsupported,
    /// A person cancelled the job while it ran ([`Jobs::cancel_job`](crate::Jobs::cancel_job)):
    /// its lease is not renewed, and its worker stops the handler. Settling it ends it cancelled.
    Cancelled,
}

/// Whether trying the same call again can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retry {
    /// A later try may succeed (a timeout, a dropped connection, throttling).
    Temporary,
    /// The same call will fail the same way; retrying only wastes attempts.
    Permanent,
}

/// The error returned by every redrive call.
///
/// Carries a [`ErrorKind`], a [`Retry`] flag and a message that never contains a payload,
/// a receipt, a token or a connection string.
/// Cloning shares the source, so one failure can answer many callers (a batch's statement, a
/// batched delete) whole.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    retry: Retry,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result` with redrive's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind`, with the retry flag that kind usually has.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let retry = match kind {
            ErrorKind::Backend => Retry::Temporary,
            _ => Retry::Permanent,
        };
        Self { kind, retry, message: message.into(), source: None }
    }

    /// A backend failure that a later try may fix.
    pub fn temporary(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Backend, message)
    }

    /// Overrides the retry flag.
    pub fn with_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether a later try of the same call may succeed.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// Shorthand for `retry() == Retry::Temporary`.
    pub fn is_temporary(&self) -> bool {
        self.retry == Retry::Temporary
    }

    /// The message, without the source chain.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_are_temporary_and_the_rest_permanent() {
        assert!(Error::temporary("timeout").is_temporary());
        assert!(!Error::new(ErrorKind::KeyConflict, "k").is_temporary());
        let forced = Error::new(ErrorKind::Backend, "bad sql").with_retry(Retry::Permanent);
        assert_eq!(forced.retry(), Retry::Permanent);
    }

    #[test]
    fn display_names_the_kind_and_the_source() {
        let e = Error::temporary("claim failed").with_source(std::io::Error::other("reset"));
        assert_eq!(e.to_string(), "Backend: claim failed: reset");
    }
}
