//! Handlers: the typed handler API, and handlers with their job type erased so one worker runs
//! many kinds.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use serde::Serialize;
use serde_json::Value;

use crate::alert::BoxFuture;
use crate::job::{Job, JobContext, JobError};

/// A handler's result for one attempt.
pub type HandlerResult = Result<Value, JobError>;

/// A handler for jobs of type `J`: any `Fn(J, JobContext) -> impl Future<Output =
/// Result<T, JobError>>` where `T: Serialize` (stored in the ledger as the effect's result).
pub trait Handler<J>: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, HandlerResult>;
}

impl<J, F, Fut, T> Handler<J> for F
where
    J: Job,
    F: Fn(J, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, JobError>> + Send + 'static,
    T: Serialize,
{
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let fut = self(job, ctx);
        Box::pin(async move {
            let value = fut.await?;
            Ok(serde_json::to_value(value).unwrap_or(Value::Null))
        })
    }
}

/// A handler with its job type erased: decodes the payload, then runs.
pub(super) trait Erased: Send + Sync {
    /// Decodes the payload and starts the handler on it; the error says why it does not decode.
    fn prepare(&self, payload: &Value, ctx: JobContext) -> Result<BoxFuture<'static, HandlerResult>, String>;
    /// The job type's own limit on one attempt ([`Job::TIMEOUT`]).
    fn timeout(&self) -> Option<std::time::Duration>;
    /// The job's [`Job::limit_key`]; `None` as well when the payload does not decode (the
    /// attempt finds that out and says why).
    fn limit_key(&self, payload: &Value) -> Option<String>;
}

pub(super) struct Typed<J, H>(pub(super) H, pub(super) std::marker::PhantomData<fn() -> J>);

impl<J: Job, H: Handler<J>> Erased for Typed<J, H> {
    fn timeout(&self) -> Option<std::time::Duration> {
        J::TIMEOUT
    }

    fn limit_key(&self, payload: &Value) -> Option<String> {
        let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| crate::decode::payload::<J>(payload)));
        decoded.ok()?.ok()?.limit_key()
    }

    fn prepare(&self, payload: &Value, ctx: JobContext) -> Result<BoxFuture<'static, HandlerResult>, String> {
        // The message names the field and the expected type, never the value: it is logged,
        // stored as the record's last error and alerted.
        // A decoder is code too (a custom `Deserialize`): its panic is an undecodable payload,
        // recorded at once, not a task that dies and leaves the job to wait out its lease.
        let job = match std::panic::catch_unwind(AssertUnwindSafe(|| crate::decode::payload::<J>(payload))) {
            Ok(decoded) => decoded?,
            Err(panic) => {
                return Err(match panic_message(panic.as_ref()) {
                    Some(message) => format!("the decoder panicked: {message}"),
                    None => "the decoder panicked".to_owned(),
                });
            }
        };
        // A handler runs code before it returns its future (a closure's body up to `async`). A
        // panic there must end this attempt like one inside the future, not the worker's task:
        // otherwise nothing settles the job and it waits out its lease, its panic message lost.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.0.call(job, ctx))) {
            Ok(run) => Ok(run),
            Err(panic) => Ok(Box::pin(std::future::ready(Err(panicked(panic))))),
        }
    }
}

/// A failed attempt for a handler that panicked, keeping the panic's message (the handler
/// author's words) when it is a string, as `panic!` and `expect` make it.
pub(super) fn panicked(panic: Box<dyn std::any::Any + Send>) -> JobError {
    match panic_message(panic.as_ref()) {
        Some(message) => JobError::retry(format!("the handler panicked: {message}")),
        None => JobError::retry("the handler panicked"),
    }
}

/// A panic's message, when it is a string (as `panic!` and `expect` make it).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> Option<&str> {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str))
}
