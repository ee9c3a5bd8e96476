//! sqlx errors mapped onto redrive's error kinds, in one place.

use redrive_core::{Error, ErrorKind, Retry};

/// Maps a sqlx error from `what` to a redrive error. A busy or locked database and a full disk
/// are temporary (another writer finishes, space is freed); a file that is not a database, or is
/// corrupt, is permanent and says so. The message names the operation, never a bound value.
pub(crate) fn db(e: sqlx::Error, what: &str) -> Error {
    let (retry, why) = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            (Retry::Temporary, None)
        }
        sqlx::Error::Database(d) => {
            // The primary result code is the low byte of the extended one.
            let code = d.code().and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff);
            match code {
                Some(5 | 6) => (Retry::Temporary, Some("the database is locked by another connection or process")),
                Some(13) => (Retry::Temporary, Some("the disk (or the database's size limit) is full")),
                Some(10) => (Retry::Temporary, Some("a disk I/O error")),
                Some(26) => (Retry::Permanent, Some("the file is not a SQLite database")),
                Some(11) => (Retry::Permanent, Some("the database file is corrupt")),
                Some(14) => (Retry::Permanent, Some("the database file cannot be opened")),
                Some(8) => (Retry::Permanent, Some("the database is read-only")),
                _ => (Retry::Permanent, None),
            }
        }
        _ => (Retry::Permanent, None),
    };
    let kind = match &e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => ErrorKind::Decode,
        _ => ErrorKind::Backend,
    };
    let message = match why {
        Some(why) => format!("sqlite: {what}: {why}"),
        None => format!("sqlite: {what}"),
    };
    Error::new(kind, message).with_retry(retry).with_source(e)
}

/// A stored value that does not read back: the file was written by something else.
pub(crate) fn stored(what: &str) -> Error {
    Error::new(ErrorKind::Decode, format!("sqlite: a stored {what} does not read back"))
}
