//! Webhook events accepted per second over a real listener, as a ratio to a bare axum handler
//! answering 200 in the same round: Stripe-signed events verified and enqueued on PostgreSQL
//! (each a job row, one transaction), the same events delivered again (answered as duplicates),
//! and the inbox on the in-memory backend.
//!
//! ```text
//! cargo bench -p redrive-http --bench webhooks
//! ```
//!
//! 16 keep-alive clients over loopback each send their share of `REDRIVE_BENCH_EVENTS` (default
//! 4,000) distinct events, signed before the clock starts. Three interleaved rounds (bare first
//! and last in each, the ratio to their mean), medians quoted; the jobs table is vacuumed and
//! analyzed after the warm-up, as autovacuum would leave it. Then one round with the server's
//! autovacuum on (1 s naptime), restored after.

use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use redrive_http::webhook::{Inbox, Stripe};
use redrive_postgres::sqlx::{self, AssertSqlSafe};
use redrive_postgres::{PgBackend, PgConfig};
use serde_json::json;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CLIENTS: usize = 16;
const SECRET: &str = "whsec_bench";

async fn serve(app: Router) -> BoxResult<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// `n` events named `prefix-i`, each with its `Stripe-Signature`.
fn signed(prefix: &str, n: usize) -> Vec<(String, String)> {
    let stripe = Stripe::new(SECRET).expect("a secret");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    (0..n)
        .map(|i| {
            let body = json!({"id": format!("evt_{prefix}_{i}"), "object": "event", "type": "invoice.paid",
                              "data": {"object": {"amount_paid": 4200, "customer": "cus_123"}}})
            .to_string();
            (stripe.signature_header(now, body.as_bytes()), body)
        })
        .collect()
}

/// Events per second: `events` sent by `CLIENTS` clients, each its share in turn.
async fn run(client: &reqwest::Client, url: &str, events: &[(String, String)]) -> BoxResult<f64> {
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for share in events.chunks(events.len().div_ceil(CLIENTS)) {
        let (client, url, share) = (client.clone(), url.to_owned(), share.to_vec());
        clients.spawn(async move {
            for (signature, body) in share {
                let response = client.post(&url).header("stripe-signature", signature).body(body).send().await?;
                assert!(response.status().is_success(), "{}", response.status());
                response.bytes().await?;
            }
            Ok::<_, reqwest::Error>(())
        });
    }
    while let Some(done) = clients.join_next().await {
        done??;
    }
    Ok(events.len() as f64 / started.elapsed().as_secs_f64())
}

async fn autovacuum(pool: &sqlx::PgPool, on: bool) -> BoxResult<()> {
    let statements = if on {
        ["ALTER SYSTEM SET autovacuum = on", "ALTER SYSTEM SET autovacuum_naptime = 1"]
    } else {
        ["ALTER SYSTEM RESET autovacuum", "ALTER SYSTEM RESET autovacuum_naptime"]
    };
    for statement in statements {
        sqlx::raw_sql(AssertSqlSafe(statement)).execute(pool).await?;
    }
    sqlx::query("SELECT pg_reload_conf()").execute(pool).await?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One cell's figure in a round.
type Cell = fn(&Round) -> f64;

struct Round {
    bare: f64,
    postgres: f64,
    again: f64,
    memory: f64,
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let n = std::env::var("REDRIVE_BENCH_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdt_{}_hookbench", std::process::id());
    let pg = PgBackend::connect(PgConfig::new(url).with_schema(&schema).with_max_connections(16)).await?;
    pg.migrate().await?;
    let bare = serve(Router::new().route("/hook", post(|_body: Bytes| async { "{}" }))).await?;
    let on_pg = serve(
        Router::new()
            .route("/hook", Inbox::new(pg.clone()).endpoint::<serde_json::Value>("bench", Stripe::new(SECRET)?)?),
    )
    .await?;
    let memory = redrive_core::MemoryBackend::new();
    let in_memory = serve(
        Router::new().route("/hook", Inbox::new(memory).endpoint::<serde_json::Value>("bench", Stripe::new(SECRET)?)?),
    )
    .await?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS).build()?;
    let warm = signed("warm", 1000);
    run(&client, &bare, &warm).await?;
    run(&client, &on_pg, &warm).await?;
    let analyze = format!("VACUUM ANALYZE \"{schema}\".jobs");
    sqlx::raw_sql(AssertSqlSafe(analyze.as_str())).execute(pg.pool()).await?;

    let mut rounds = Vec::new();
    for round in 0..3 {
        let events = signed(&format!("r{round}"), n);
        let first = run(&client, &bare, &events).await?;
        let postgres = run(&client, &on_pg, &events).await?;
        let again = run(&client, &on_pg, &events).await?;
        let memory = run(&client, &in_memory, &events).await?;
        let last = run(&client, &bare, &events).await?;
        rounds.push(Round { bare: (first + last) / 2.0, postgres, again, memory });
    }
    autovacuum(pg.pool(), true).await?;
    let events = signed("autovacuum", n);
    let measured = async {
        let first = run(&client, &bare, &events).await?;
        let postgres = run(&client, &on_pg, &events).await?;
        let last = run(&client, &bare, &events).await?;
        BoxResult::Ok(((first + last) / 2.0, postgres))
    }
    .await;
    autovacuum(pg.pool(), false).await?;
    let (av_bare, av_pg) = measured?;

    println!("{n} events per cell, {CLIENTS} clients; events accepted per second (ratio to the bare handler)");
    println!("| cell | round 1 | round 2 | round 3 | median | ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    let base = median(rounds.iter().map(|r| r.bare).collect());
    let cells: [(&str, Cell); 4] = [
        ("bare axum handler answering 200", |r| r.bare),
        ("inbox on PostgreSQL: new events", |r| r.postgres),
        ("inbox on PostgreSQL: the same events again", |r| r.again),
        ("inbox in memory: new events", |r| r.memory),
    ];
    for (name, cell) in cells {
        let values: Vec<f64> = rounds.iter().map(cell).collect();
        let ratios = median(rounds.iter().map(|r| cell(r) / r.bare).collect());
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {ratios:.2}× |",
            values[0],
            values[1],
            values[2],
            median(values.clone())
        );
    }
    println!("| autovacuum on: bare | {av_bare:.0} | | | | 1.00× |");
    println!("| autovacuum on: inbox on PostgreSQL, new events | {av_pg:.0} | | | | {:.2}× |", av_pg / av_bare);
    println!("(the median bare figure: {base:.0} events/s)");
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE").as_str())).execute(pg.pool()).await?;
    Ok(())
}
