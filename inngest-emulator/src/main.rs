//! `inngest-emulator`: a local Inngest for offline development.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redrive_inngest_emulator::Emulator;

/// A local Inngest emulator (loopback only; state in memory).
#[derive(Debug, Parser)]
#[command(name = "inngest-emulator", version, about)]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8288")]
    bind: SocketAddr,
    /// The event key to accept.
    #[arg(long, default_value = "test-event-key")]
    event_key: String,
    /// The signing key (`signkey-<env>-<hex>`; default: random, printed on start).
    #[arg(long)]
    signing_key: Option<String>,
    /// How long an event id keeps a function from running again for it (e.g. 24h, 10m).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    dedupe_window: Duration,
    /// Multiplier of the retry backoff (e.g. 0.01 for fast local retries).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// The most steps a run may memoize (Inngest's limit: 1000).
    #[arg(long, default_value_t = 1_000)]
    max_steps: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut builder = Emulator::builder()
        .event_key(args.event_key)
        .dedupe_window(args.dedupe_window)
        .time_scale(args.time_scale)
        .max_steps(args.max_steps);
    if let Some(key) = args.signing_key {
        builder = builder.signing_key(key);
    }
    let emu = match builder.start(args.bind).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("inngest-emulator: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Local development values, printed so that a shell can `export` them. INNGEST_DEV is not
    // one of them: it would turn the SDKs' signature checks off.
    println!("Inngest emulator listening (local development only; these values are not secrets):");
    println!("INNGEST_BASE_URL={}", emu.url());
    println!("INNGEST_EVENT_KEY={}", emu.event_key());
    println!("INNGEST_SIGNING_KEY={}", emu.signing_key());
    let _ = tokio::signal::ctrl_c().await;
    eprintln!("inngest-emulator: stopping");
    emu.shutdown().await;
    ExitCode::SUCCESS
}
