//! Flow control's cost (issue 25): a default burn-down of 100k jobs (long enough that a run's
//! first round trips and its ramp do not make the figure) with no limit, with a concurrency
//! limit and a rate limit configured but not binding, and with a limit of one job at a time per
//! key over 1,000 keys, the keys in turn (rarely binding) and in runs of 100 (binding: a claim's
//! jobs share two or three keys); interleaved, three times each, then the first two with
//! autovacuum on. The order section likewise: no order key, order keys over 1,000 accounts in
//! turn (a claim's check finds nothing earlier), and in runs of 100 (binding: one account's jobs
//! one at a time, the claims skipping the rest of its run). The priority section: no priority, and
//! five priorities in turn (each claim takes the highest left).

use redrive_core::{Limits, Rate, WorkerConfig};

use std::sync::atomic::Ordering;

use crate::{
    BURN_TIMEOUT, BoxResult, Burn, CONCURRENCY, Ctx, Figure, ORDER_RUN, PRIORITY_MIX, burn_down_limited, production,
    rate,
};

/// Each cell: its limits, and how many consecutive jobs share a tenant (0: none).
fn cells() -> [(&'static str, Limits, u64); 4] {
    let one_per_key = Limits { key_concurrency: Some(1), ..Limits::default() };
    [
        ("no limit", Limits::default(), 0),
        (
            "a concurrency limit and a rate configured, not binding",
            Limits { concurrency: Some(1_000), rate: Some(Rate::per_second(10_000_000)), ..Limits::default() },
            0,
        ),
        ("one at a time per key, 1,000 keys in turn (rarely binding)", one_per_key, 1),
        ("one at a time per key, 1,000 keys of 100 jobs in a row (binding)", one_per_key, 100),
    ]
}

/// Jobs per burn-down.
const FLOW_JOBS: u64 = 100_000;

fn config() -> WorkerConfig {
    WorkerConfig { concurrency: CONCURRENCY, ..WorkerConfig::default() }
}

/// Runs each cell `rounds` times interleaved, by `run`; the medians. `label` names a cell.
async fn interleaved<C>(
    cells: &[C],
    rounds: usize,
    label: impl Fn(&C) -> &str,
    run: impl AsyncFn(&C) -> BoxResult<Burn>,
) -> BoxResult<Vec<f64>> {
    let mut runs: Vec<Vec<f64>> = vec![vec![]; cells.len()];
    for round in 1..=rounds {
        for (i, cell) in cells.iter().enumerate() {
            let burn = run(cell).await?;
            println!("- {} (round {round}): {}", label(cell), burn.describe());
            runs[i].push(burn.rate());
        }
    }
    Ok(runs
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect())
}

/// The flow cells, `rounds` times interleaved; the medians.
async fn medians(ctx: &Ctx, cells: &[(&'static str, Limits, u64)], rounds: usize) -> BoxResult<Vec<f64>> {
    interleaved(
        cells,
        rounds,
        |c| c.0,
        async |&(_, limits, tenant_run)| {
            burn_down_limited(ctx, config(), FLOW_JOBS, BURN_TIMEOUT, limits, tenant_run).await
        },
    )
    .await
}

pub(crate) async fn section(ctx: &Ctx, lifecycle: f64) -> BoxResult<Vec<(String, Figure)>> {
    println!();
    println!("## Flow control: {FLOW_JOBS} jobs, concurrency {CONCURRENCY}, three interleaved rounds");
    let cells = cells();
    let analyzed = medians(ctx, &cells, 3).await?;
    println!();
    println!("## Flow control with autovacuum on");
    let autovacuum = production::with_autovacuum(ctx, medians(ctx, &cells[..2], 3)).await?;
    let mut rows = vec![];
    for ((label, ..), median) in cells.iter().zip(&analyzed) {
        println!(
            "- {label}, median: {} ({:.2}× lifecycle.sql at the start, {:.3}× no limit)",
            rate(*median),
            median / lifecycle,
            median / analyzed[0]
        );
        rows.push((format!("flow: {label}"), Figure::Rate(*median)));
    }
    for ((label, ..), median) in cells.iter().zip(&autovacuum) {
        println!("- autovacuum on, {label}, median: {} ({:.3}× no limit)", rate(*median), median / autovacuum[0]);
        rows.push((format!("flow, autovacuum on: {label}"), Figure::Rate(*median)));
    }
    Ok(rows)
}

/// Each order cell: how many consecutive jobs share an account (0: no order key).
const ORDER_CELLS: [(&str, u64); 3] = [
    ("no order key", 0),
    ("order keys, 1,000 accounts in turn", 1),
    ("order keys, 1,000 accounts of 100 jobs in a row (binding)", 100),
];

/// The order cells, `rounds` times interleaved; the medians.
async fn order_medians(ctx: &Ctx, cells: &[(&'static str, u64)], rounds: usize) -> BoxResult<Vec<f64>> {
    interleaved(
        cells,
        rounds,
        |c| c.0,
        async |&(_, order_run)| {
            ORDER_RUN.store(order_run, Ordering::Relaxed);
            let burn = burn_down_limited(ctx, config(), FLOW_JOBS, BURN_TIMEOUT, Limits::default(), 0).await;
            ORDER_RUN.store(0, Ordering::Relaxed);
            burn
        },
    )
    .await
}

pub(crate) async fn order_section(ctx: &Ctx, lifecycle: f64) -> BoxResult<Vec<(String, Figure)>> {
    // For tuning: REDRIVE_BENCH_ORDER_RUN=N runs the one cell of N jobs in a row per account, once.
    if let Some(run) = std::env::var("REDRIVE_BENCH_ORDER_RUN").ok().and_then(|v| v.parse::<u64>().ok()) {
        let rates = order_medians(ctx, &[("order keys, tuning", run)], 1).await?;
        println!("- {:.2}× lifecycle.sql at the start", rates[0] / lifecycle);
        return Ok(vec![]);
    }
    println!();
    println!("## Order per key: {FLOW_JOBS} jobs, concurrency {CONCURRENCY}, three interleaved rounds");
    let analyzed = order_medians(ctx, &ORDER_CELLS, 3).await?;
    println!();
    println!("## Order per key with autovacuum on");
    let autovacuum = production::with_autovacuum(ctx, order_medians(ctx, &ORDER_CELLS[..2], 3)).await?;
    let mut rows = vec![];
    for ((label, _), median) in ORDER_CELLS.iter().zip(&analyzed) {
        println!(
            "- {label}, median: {} ({:.2}× lifecycle.sql at the start, {:.3}× no order key)",
            rate(*median),
            median / lifecycle,
            median / analyzed[0]
        );
        rows.push((format!("order: {label}"), Figure::Rate(*median)));
    }
    for ((label, _), median) in ORDER_CELLS.iter().zip(&autovacuum) {
        println!("- autovacuum on, {label}, median: {} ({:.3}× no order key)", rate(*median), median / autovacuum[0]);
        rows.push((format!("order, autovacuum on: {label}"), Figure::Rate(*median)));
    }
    Ok(rows)
}

/// Each priority cell: how many priorities the jobs take in turn (0: all 0).
const PRIORITY_CELLS: [(&str, u64); 2] = [("no priority", 0), ("priorities mixed, five in turn", 5)];

/// The cost of priorities: the same 100k burn-down, all at priority 0 and spread over five
/// priorities, interleaved three times, analyzed and checkpointed as every backlog.
pub(crate) async fn priority_section(ctx: &Ctx, lifecycle: f64) -> BoxResult<Vec<(String, Figure)>> {
    println!();
    println!("## Priorities: {FLOW_JOBS} jobs, concurrency {CONCURRENCY}, three interleaved rounds");
    let medians = interleaved(
        &PRIORITY_CELLS,
        3,
        |c| c.0,
        async |&(_, mix)| {
            PRIORITY_MIX.store(mix, Ordering::Relaxed);
            let burn = burn_down_limited(ctx, config(), FLOW_JOBS, BURN_TIMEOUT, Limits::default(), 0).await;
            PRIORITY_MIX.store(0, Ordering::Relaxed);
            burn
        },
    )
    .await?;
    let mut rows = vec![];
    for ((label, _), median) in PRIORITY_CELLS.iter().zip(&medians) {
        println!(
            "- {label}, median: {} ({:.2}× lifecycle.sql at the start, {:.3}× no priority)",
            rate(*median),
            median / lifecycle,
            median / medians[0]
        );
        rows.push((format!("priority: {label}"), Figure::Rate(*median)));
    }
    Ok(rows)
}
