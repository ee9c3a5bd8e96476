//! `PgmqConfig`: which pgmq queue, and what a message may carry.

use redrive_core::{Error, ErrorKind, Result};

/// The longest queue name pgmq takes (its table names must fit PostgreSQL's 63 bytes).
const MAX_NAME: usize = 47;

/// A pgmq queue in the application's database.
#[derive(Debug, Clone)]
pub struct PgmqConfig {
    pub(crate) queue: String,
    pub(crate) max_payload: usize,
}

impl PgmqConfig {
    /// The queue `queue` (pgmq's name, without the `q_` of its table): 1 to 47 of `a-z 0-9 _`,
    /// starting with a letter or `_`, checked when the backend connects.
    pub fn new(queue: impl Into<String>) -> Self {
        Self { queue: queue.into(), max_payload: 1024 * 1024 }
    }

    /// The largest payload a job may carry, in bytes (1 MiB by default): a message is a `jsonb`
    /// row, read whole by every claim, so keep large documents elsewhere and send their ids.
    pub fn with_max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }
}

/// A queue name pgmq takes and that needs no quoting in SQL: its tables are `pgmq.q_<name>` and
/// `pgmq.a_<name>`, named in statements as they are.
pub(crate) fn check_queue_name(name: &str) -> Result<()> {
    let first_ok = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let ok = first_ok
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidName,
            format!("pgmq queue name {name:?} must be 1 to {MAX_NAME} of a-z 0-9 _, starting with a letter or _"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pgmq_takes_unquoted() {
        assert!(check_queue_name("orders").is_ok());
        assert!(check_queue_name("_jobs_2").is_ok());
        for bad in ["", "Orders", "2jobs", "a-b", "a;drop", &"x".repeat(48)] {
            assert_eq!(check_queue_name(bad).unwrap_err().kind(), ErrorKind::InvalidName, "{bad}");
        }
    }
}
