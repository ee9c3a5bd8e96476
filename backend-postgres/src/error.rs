//! sqlx errors mapped onto redrive's error kinds, in one place.

use redrive_core::{Error, ErrorKind, Retry};

/// Maps a sqlx error from `what` to a redrive error: connection and contention failures are
/// temporary, constraint and data errors permanent. The message names the operation, never the
/// connection string or the bound values.
pub(crate) fn db(e: sqlx::Error, what: &str) -> Error {
    let retry = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Protocol(_) => {
            Retry::Temporary
        }
        sqlx::Error::Database(d) => match d.code().as_deref().map(|c| &c[..2.min(c.len())]) {
            // connection exception, transaction rollback (serialization, deadlock),
            // insufficient resources, operator intervention (admin shutdown, terminated backend)
            Some("08" | "40" | "53" | "57") => Retry::Temporary,
            _ => Retry::Permanent,
        },
        sqlx::Error::WorkerCrashed | sqlx::Error::Tls(_) => Retry::Temporary,
        _ => Retry::Permanent,
    };
    let kind = match &e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => ErrorKind::Decode,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("postgres: {what}")).with_retry(retry).with_source(e)
}

/// Whether a failed statement may have failed only because its connection did.
pub(crate) fn is_connection_loss(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed)
        || matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P")))
}
