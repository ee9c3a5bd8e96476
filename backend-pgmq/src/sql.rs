//! The statements, read from `queries/*.sql` at compile time, with the queue's table names and
//! the records' schema (checked plain identifiers) filled in once.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

macro_rules! statements {
    ($($name:ident),* $(,)?) => {
        /// Every statement, for one queue (`mention` is the test aid's).
        #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
        pub(crate) struct Sql { $(pub(crate) $name: Arc<str>,)* }

        impl Sql {
            pub(crate) fn new(schema: &str, queue: &str) -> Self {
                let fill = |text: &str| -> Arc<str> {
                    text.replace("{queue}", &format!("q_{queue}"))
                        .replace("{archive}", &format!("a_{queue}"))
                        .replace("{schema}", &format!("\"{schema}\""))
                        .into()
                };
                Self { $($name: fill(include_str!(concat!("../queries/", stringify!($name), ".sql"))),)* }
            }
        }
    };
}

statements!(
    read,
    send,
    complete,
    retry,
    give_back,
    renew,
    hold,
    archive,
    metrics,
    mention,
    forget_archived,
    archive_forget_one,
    archive_purge,
    create,
    exists,
    keys_take,
    keys_sent,
    keys_replayed,
    keys_prune,
);

/// A query on a statement text built from this crate's own files and a checked queue name.
pub(crate) fn q(text: &Arc<str>) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(AssertSqlSafe(Arc::clone(text)))
}
