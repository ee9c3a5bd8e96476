//! The layer's overhead per request, as a ratio to the same axum route without it, in one run:
//! for a first request (the key taken, the handler run, the response stored) and for a stored
//! repeat (the response read back), on PostgreSQL's ledger and in memory.
//!
//! ```text
//! cargo bench -p redrive-http --bench overhead
//! ```
//!
//! One keep-alive client sends requests one at a time over loopback; each figure is the mean
//! time per request over `REDRIVE_BENCH_REQUESTS` (default 2,000). Order: bare, layered first,
//! layered repeat, bare again; the ratios divide by the mean of the two bare runs. The ledger
//! table is vacuumed and analyzed after the warm-up, as autovacuum would leave it in production.

use std::time::Instant;

use axum::Router;
use axum::routing::post;
use redrive_http::Idempotency;
use redrive_postgres::{PgBackend, PgConfig};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

async fn serve(app: Router) -> BoxResult<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/charges", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

fn route() -> Router {
    Router::new().route("/charges", post(|body: String| async move { format!(r#"{{"charged":{}}}"#, body.len()) }))
}

/// Mean microseconds per request, keys `prefix-0` … (or none).
async fn run(client: &reqwest::Client, url: &str, n: usize, prefix: Option<&str>) -> BoxResult<f64> {
    let started = Instant::now();
    for i in 0..n {
        let mut request = client.post(url).body(r#"{"amount":5,"currency":"eur"}"#);
        if let Some(prefix) = prefix {
            request = request.header("Idempotency-Key", format!("{prefix}-{i}"));
        }
        let response = request.send().await?;
        assert!(response.status().is_success());
        response.bytes().await?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / n as f64)
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let n = std::env::var("REDRIVE_BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdt_{}_httpbench", std::process::id());
    let pg = PgBackend::connect(PgConfig::new(url).with_schema(schema).with_max_connections(4)).await?;
    pg.migrate().await?;
    let bare = serve(route()).await?;
    let on_pg = serve(route().layer(Idempotency::new(pg.clone()).unscoped())).await?;
    let in_memory = serve(route().layer(Idempotency::new(redrive_core::MemoryBackend::new()).unscoped())).await?;
    let client = reqwest::Client::new();
    run(&client, &bare, 200, None).await?; // warm-up: connections, caches
    run(&client, &on_pg, 200, Some("warm")).await?;
    // Statistics as production's autovacuum would have them, not those of an empty table.
    let analyze = format!("VACUUM ANALYZE \"{}\".processed_keys", pg.schema());
    redrive_postgres::sqlx::query(redrive_postgres::sqlx::AssertSqlSafe(analyze)).execute(pg.pool()).await?;

    let bare_1 = run(&client, &bare, n, None).await?;
    let pg_first = run(&client, &on_pg, n, Some("k")).await?;
    let pg_repeat = run(&client, &on_pg, n, Some("k")).await?;
    let mem_first = run(&client, &in_memory, n, Some("k")).await?;
    let mem_repeat = run(&client, &in_memory, n, Some("k")).await?;
    let bare_2 = run(&client, &bare, n, None).await?;
    let base = (bare_1 + bare_2) / 2.0;
    println!("{n} requests each, one at a time; mean per request");
    println!("  bare route                     {bare_1:>8.1} µs, again {bare_2:.1} µs");
    for (name, us) in [
        ("Postgres ledger, first", pg_first),
        ("Postgres ledger, repeat", pg_repeat),
        ("memory ledger, first", mem_first),
        ("memory ledger, repeat", mem_repeat),
    ] {
        println!("  {name:<30} {us:>8.1} µs   {:.2}× the bare route", us / base);
    }
    sqlx_drop(&pg).await;
    Ok(())
}

async fn sqlx_drop(pg: &PgBackend) {
    let drop = format!("DROP SCHEMA \"{}\" CASCADE", pg.schema());
    let _ = redrive_postgres::sqlx::query(redrive_postgres::sqlx::AssertSqlSafe(drop)).execute(pg.pool()).await;
}
