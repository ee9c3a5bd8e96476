//! The whole conformance suite, both halves, against a real PostgreSQL, each scenario in its
//! own schema.

mod common;

use redrive_conformance::{Subject, Timing};
use redrive_core::Forget;
use redrive_postgres::PgBackend;
use sqlx::AssertSqlSafe;

async fn postgres() -> Subject<PgBackend, PgBackend> {
    let backend = common::backend("conf").await;
    let (pool, schema) = (backend.pool().clone(), backend.schema().to_owned());
    let forgetter = backend.clone();
    Subject::new(backend.clone(), backend, Timing::default())
        .storage(move |text| {
            let (pool, schema) = (pool.clone(), schema.clone());
            async move { holds_text(&pool, &schema, &text).await }
        })
        .forget(move |key| {
            let backend = forgetter.clone();
            async move { backend.forget_key(&key).await }
        })
}

/// Whether `text` is in any row of any of the schema's tables, read as text.
async fn holds_text(pool: &sqlx::PgPool, schema: &str, text: &str) -> bool {
    let tables = ["jobs", "job_keys", "failed_jobs", "processed_keys", "applied_effects"];
    let query = tables
        .iter()
        .map(|t| format!("SELECT 1 FROM \"{schema}\".{t} AS r WHERE strpos(r::text, $1) > 0"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let found = sqlx::query(AssertSqlSafe(format!("SELECT EXISTS ({query})")))
        .bind(text)
        .fetch_one(pool)
        .await
        .expect("the storage probe reads every table");
    sqlx::Row::get(&found, 0)
}

redrive_conformance::suite!(postgres());
