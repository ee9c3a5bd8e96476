//! `qstash-emulator`: a local QStash for offline development.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use redrive_qstash_emulator::Emulator;

/// A local QStash emulator (loopback only; state in memory).
#[derive(Debug, Parser)]
#[command(name = "qstash-emulator", version, about)]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8585")]
    bind: SocketAddr,
    /// The bearer token to accept (default: a random one, printed on start).
    #[arg(long)]
    token: Option<String>,
    /// The current signing key (default: random).
    #[arg(long)]
    current_signing_key: Option<String>,
    /// The next signing key (default: random).
    #[arg(long)]
    next_signing_key: Option<String>,
    /// Multiplier of QStash's retry backoff (e.g. 0.01 for fast local retries).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Retries of a message published without Upstash-Retries.
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut builder = Emulator::builder().time_scale(args.time_scale).max_retries(args.max_retries);
    if let Some(t) = args.token {
        builder = builder.token(t);
    }
    match (args.current_signing_key, args.next_signing_key) {
        (Some(c), Some(n)) => builder = builder.signing_keys(c, n),
        (None, None) => {}
        _ => {
            eprintln!("qstash-emulator: give both --current-signing-key and --next-signing-key, or neither");
            return ExitCode::from(2);
        }
    }
    let emu = match builder.start(args.bind).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("qstash-emulator: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Local development values, printed so that a shell can `export` them.
    println!("QStash emulator listening (local development only; these values are not secrets):");
    println!("QSTASH_URL={}", emu.url());
    println!("QSTASH_TOKEN={}", emu.token());
    println!("QSTASH_CURRENT_SIGNING_KEY={}", emu.current_signing_key());
    println!("QSTASH_NEXT_SIGNING_KEY={}", emu.next_signing_key());
    wait_for_signal().await;
    eprintln!("qstash-emulator: stopping");
    emu.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
