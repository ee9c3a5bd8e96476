//! The SQL, read from `queries/*.sql` and `migrations/*.sql` at compile time, with the schema
//! name filled in once at start-up.

use std::sync::Arc;

use redrive_core::{Error, ErrorKind, Result};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

/// A schema name: a plain lower-case SQL identifier, so that quoting it is all the escaping needed.
pub(crate) fn check_schema(name: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let ok = first_ok
        && name.len() <= 48
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidName,
            format!(
                "schema name {name:?} must be 1 to 48 of a-z 0-9 _, start with a letter or _, and not start with pg_"
            ),
        ))
    }
}

/// What the statements that end a running job (retry, release, the sweep) do besides, where it
/// ends cancelled: one fragment, spliced in for `{ended_cancelled}`.
const ENDED_CANCELLED: &str = include_str!("../queries/fragments/ended_cancelled.sql");

macro_rules! queries {
    ($($name:ident),* $(,)?) => {
        /// Every query, with the schema filled in.
        pub(crate) struct Queries { $(pub(crate) $name: Arc<str>,)* }

        impl Queries {
            pub(crate) fn new(schema: &str) -> Self {
                let quoted = format!("\"{schema}\"");
                // The schema is checked to be [a-z0-9_], so its channel can be a literal.
                let channel = format!("redrive_{schema}");
                Self { $($name: include_str!(concat!("../queries/", stringify!($name), ".sql"))
                    .replace("{ended_cancelled}", ENDED_CANCELLED.trim_end())
                    .replace("{schema}", &quoted).replace("{channel}", &channel).into(),)* }
            }
        }
    };
}

queries!(
    enqueue,
    enqueue_batch,
    order_lock,
    existing,
    claim,
    complete,
    retry,
    extend,
    cancel_asked,
    release,
    dead_letter,
    sweep,
    list_failures,
    get_failure,
    count_open,
    blocked,
    discard,
    purge,
    replay,
    prune_done,
    prune_ledger,
    queue_counts,
    ledger_begin,
    ledger_state,
    ledger_extend,
    ledger_release,
    ledger_finish,
    ledger_cancel,
    effect_begin,
    effect_result,
    notify,
    broker_keep,
    broker_lock,
    broker_list,
    broker_cursor,
    broker_get,
    broker_count_open,
    broker_take,
    broker_close,
    broker_confirm,
    broker_discard_replaying,
    forget_key,
    doctor_migrations,
    doctor_unique,
    doctor_autovacuum,
    doctor_vacuum,
    doctor_unalerted,
    doctor_broker_open,
    doctor_alert_marks,
    broker_purge,
    broker_mention,
    flow_kinds,
    flow_pause,
    flow_resume,
    flow_set_limits,
    flow_events,
    flow_take_probe,
    flow_close_breaker,
    flow_take_tokens,
    flow_take_slot,
    flow_renew_slot,
    flow_release_slot,
    list_jobs,
    get_job,
    cancel_job,
);

/// Runs a query string that was built from the files above.
pub(crate) fn q(sql: &Arc<str>) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(AssertSqlSafe(Arc::clone(sql)))
}

/// The embedded migrations for `schema`, tracked in `"schema"._sqlx_migrations`, so several
/// schemas in one database migrate independently.
pub(crate) fn migrator(schema: &str) -> Migrator {
    let quoted = format!("\"{schema}\"");
    let files: [(i64, &str, &str); 14] = [
        (1, "init", include_str!("../migrations/0001_init.sql")),
        (2, "done index", include_str!("../migrations/0002_done_index.sql")),
        (3, "contract v2", include_str!("../migrations/0003_contract_v2.sql")),
        (4, "broker records", include_str!("../migrations/0004_broker_records.sql")),
        (5, "deadline", include_str!("../migrations/0005_deadline.sql")),
        (6, "replay audit", include_str!("../migrations/0006_replay_audit.sql")),
        (7, "flow", include_str!("../migrations/0007_flow.sql")),
        (8, "order", include_str!("../migrations/0008_order.sql")),
        (9, "replay confirm", include_str!("../migrations/0009_replay_confirm.sql")),
        (10, "live", include_str!("../migrations/0010_live.sql")),
        (11, "priority", include_str!("../migrations/0011_priority.sql")),
        (12, "cancel running", include_str!("../migrations/0012_cancel_running.sql")),
        (13, "trace", include_str!("../migrations/0013_trace.sql")),
        (14, "broker keys", include_str!("../migrations/0014_broker_keys.sql")),
    ];
    let migrations = files
        .into_iter()
        .map(|(version, description, sql)| {
            let sql = AssertSqlSafe(sql.replace("{schema}", &quoted)).into_sql_str();
            Migration::new(version, description.into(), MigrationType::Simple, sql, false)
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.create_schema(quoted.clone());
    migrator.dangerous_set_table_name(format!("{quoted}._sqlx_migrations"));
    migrator
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["redrive", "_jobs", "tenant_42"] {
            assert!(check_schema(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Redrive", "1jobs", "a-b", "x\"; drop table jobs; --", "pg_catalog", &"a".repeat(49)] {
            assert_eq!(check_schema(bad).unwrap_err().kind(), ErrorKind::InvalidName, "{bad}");
        }
    }

    #[test]
    fn every_query_names_the_schema() {
        let q = Queries::new("tenant_1");
        for sql in [&q.enqueue, &q.claim, &q.dead_letter, &q.replay, &q.sweep, &q.ledger_begin, &q.flow_take_slot] {
            assert!(sql.contains("\"tenant_1\".") && !sql.contains("{schema}"));
        }
        for sql in [&q.retry, &q.release, &q.sweep] {
            assert!(
                sql.contains("replay_closed AS (") && !sql.contains("{ended_cancelled}") && !sql.contains("{channel}")
            );
        }
    }
}
