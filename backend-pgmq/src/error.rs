//! sqlx's errors as redrive's, in one place: what the statement was doing, whether to retry, and
//! sqlx's error as the source (never a payload or a token).

use redrive_core::{Error, ErrorKind, Retry};

/// `e`, from the statement that was doing `what`.
pub(crate) fn db(e: sqlx::Error, what: &str) -> Error {
    let retry = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => Retry::Temporary,
        // connection exception, transaction rollback, insufficient resources, operator intervention
        sqlx::Error::Database(d) => match d.code().as_deref().map(|c| &c[..2.min(c.len())]) {
            Some("08" | "40" | "53" | "57") => Retry::Temporary,
            _ => Retry::Permanent,
        },
        _ => Retry::Permanent,
    };
    let kind = match &e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => ErrorKind::Decode,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("pgmq: {what}")).with_retry(retry).with_source(e)
}

/// A settlement that found the message no longer this read's: its lease lapsed and another
/// read took it, or it was settled already.
pub(crate) fn lease_lost(what: &str) -> Error {
    Error::new(ErrorKind::LeaseLost, format!("pgmq: {what}: the message is no longer held by this claim"))
}
