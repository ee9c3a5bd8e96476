//! The SQL, read from `queries/*.sql` and `migrations/*.sql` at compile time.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::{AssertSqlSafe, SqlSafeStr};

macro_rules! queries {
    ($($name:ident),* $(,)?) => {
        $(
            pub(crate) const $name: &str = include_str!(concat!("../queries/", stringify!($name), ".sql"));
        )*
    };
}

#[allow(non_upper_case_globals)]
mod text {
    queries!(
        enqueue,
        existing,
        sweep,
        claim,
        complete,
        retry,
        give_back,
        extend,
        cancel_asked,
        cancel_ask,
        fail,
        record,
        list_failures,
        get_failure,
        count_open,
        discard,
        discard_order,
        blocked,
        close_replayed,
        requeue,
        confirm,
        cancel_replay,
        failed_again,
        record_replay_of,
        key_done,
        purge,
        purge_job_key,
        purge_job,
        purge_alerts,
        forget_running,
        forget_records,
        forget_broker_records,
        forget_job,
        forget_ledger_key,
        forget_effect,
        doctor_migrations,
        doctor_indexes,
        doctor_quick_check,
        doctor_journal_mode,
        doctor_unalerted,
        prune_done_keys,
        prune_done,
        prune_ledger,
        prune_effects,
        queue_counts,
        ledger_get,
        ledger_insert,
        ledger_take,
        ledger_extend,
        ledger_release,
        ledger_finish,
        ledger_cancel,
        effect_begin,
        effect_result,
        broker_keep,
        broker_list,
        broker_cursor,
        broker_get,
        broker_count_open,
        broker_take,
        broker_close,
        broker_settle,
        broker_state,
        broker_purge,
        broker_mention,
        flow_kinds,
        flow_pause,
        flow_paused,
        flow_unpause,
        flow_set_limits,
        flow_event,
        flow_events,
        flow_take_probe,
        flow_bucket,
        flow_bucket_set,
        flow_take_slot,
        flow_renew_slot,
        flow_release_slot,
        list_jobs,
        get_job,
        cancel_job,
    );
}

pub(crate) use text::*;

/// A query from the files above.
pub(crate) fn q(sql: &'static str) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    sqlx::query(sql)
}

/// The embedded migrations, tracked in `_sqlx_migrations`.
pub(crate) fn migrator() -> Migrator {
    let files: [(i64, &str, &str); 11] = [
        (1, "init", include_str!("../migrations/0001_init.sql")),
        (2, "broker records", include_str!("../migrations/0002_broker_records.sql")),
        (3, "deadline", include_str!("../migrations/0003_deadline.sql")),
        (4, "replay audit", include_str!("../migrations/0004_replay_audit.sql")),
        (5, "flow", include_str!("../migrations/0005_flow.sql")),
        (6, "order", include_str!("../migrations/0006_order.sql")),
        (7, "replay confirm", include_str!("../migrations/0007_replay_confirm.sql")),
        (8, "live", include_str!("../migrations/0008_live.sql")),
        (9, "priority", include_str!("../migrations/0009_priority.sql")),
        (10, "cancel running", include_str!("../migrations/0010_cancel_running.sql")),
        (11, "trace", include_str!("../migrations/0011_trace.sql")),
    ];
    let migrations = files
        .into_iter()
        .map(|(version, description, sql)| {
            Migration::new(version, description.into(), MigrationType::Simple, AssertSqlSafe(sql).into_sql_str(), false)
        })
        .collect();
    Migrator::with_migrations(migrations)
}
