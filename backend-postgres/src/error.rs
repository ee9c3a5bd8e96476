//! sqlx errors mapped onto redrive's error kinds, in one place.

use redrive_core::{Error, ErrorKind, Retry};

/// Maps a sqlx error from `what` to a redrive error: connection and contention failures are
/// temporary, constraint and data errors permanent. The message names the operation, never the
/// connection string or the bound values.
pub(crate) fn db(e: sqlx::Error, what: &str) -> Error {
    classified(&e, what).with_source(e)
}

/// The error `e` maps to, without its source.
fn classified(e: &sqlx::Error, what: &str) -> Error {
    let retry = match e {
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
    let kind = match e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => ErrorKind::Decode,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("postgres: {what}")).with_retry(retry)
}

/// Whether a failed statement may have failed only because its connection did.
pub(crate) fn is_connection_loss(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed)
        || matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P")))
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A server error with an SQLSTATE, as the driver reports it.
    #[derive(Debug)]
    struct Server(&'static str);

    impl std::fmt::Display for Server {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Server {}

    impl sqlx::error::DatabaseError for Server {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn retry_of(code: &'static str) -> Retry {
        db(sqlx::Error::Database(Box::new(Server(code))), "complete").retry()
    }

    #[test]
    fn deadlocks_serialization_failures_and_lost_connections_are_temporary() {
        for code in ["40P01", "40001", "08006", "57P01", "53300"] {
            assert_eq!(retry_of(code), Retry::Temporary, "SQLSTATE {code}");
        }
        let lost = db(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)), "complete");
        assert_eq!(lost.retry(), Retry::Temporary);
        for code in ["23505", "42601", "22P02"] {
            assert_eq!(retry_of(code), Retry::Permanent, "SQLSTATE {code}");
        }
    }
}
