//! The official QStash clients against the emulator: `@upstash/qstash` (Node) and `qstash`
//! (PyPI), installed by `scripts/services` (`REDRIVE_QSTASH_NODE_DIR`, `REDRIVE_QSTASH_PYTHON`).
//!
//! Under `CI=true` a missing client fails the test; elsewhere the test is skipped with a note.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redrive_qstash_emulator::{Emulator, RunningEmulator};

fn tools_dir() -> PathBuf {
    std::env::var_os("REDRIVE_TOOLS").map(PathBuf::from).unwrap_or_else(|| "/var/cache/redrive-tools".into())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `Some(path)` when it exists; otherwise fails under CI and returns `None` (skip) elsewhere.
fn require(what: &str, path: PathBuf, check: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    if check(&path) {
        return Some(path);
    }
    let msg = format!(
        "{what} not found at {} (run scripts/services start, then eval \"$(scripts/services env)\")",
        path.display()
    );
    if in_ci() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

async fn emulator() -> RunningEmulator {
    Emulator::builder().time_scale(0.0).start_local().await.unwrap()
}

/// Runs `cmd` with the emulator's env, up to two minutes; returns stdout, panicking on failure.
async fn run(mut cmd: Command, emu: &RunningEmulator) -> String {
    cmd.env("QSTASH_URL", emu.url())
        .env("QSTASH_TOKEN", emu.token())
        .env("QSTASH_CURRENT_SIGNING_KEY", emu.current_signing_key())
        .env("QSTASH_NEXT_SIGNING_KEY", emu.next_signing_key())
        .env_remove("QSTASH_DEV")
        .env("UPSTASH_DISABLE_TELEMETRY", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let desc = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("could not run {desc}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "client script failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_typescript_client_works_against_the_emulator() {
    let dir = std::env::var_os("REDRIVE_QSTASH_NODE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_dir().join("qstash-clients/node_modules"));
    let Some(dir) = require("@upstash/qstash (npm)", dir, |d| d.join("@upstash/qstash/package.json").is_file()) else {
        return;
    };
    let Some(node) = require("node", PathBuf::from("node"), |_| Command::new("node").arg("--version").output().is_ok())
    else {
        return;
    };
    let emu = emulator().await;
    let mut cmd = Command::new(node);
    cmd.arg(script("node_client.cjs")).env("NODE_PATH", &dir);
    let out = run(cmd, &emu).await;
    for line in [
        "ok publishJSON+receiver",
        "ok batchJSON 2",
        "ok dlq.listMessages",
        "ok dlq.retry",
        "ok dlq.delete",
        "ok logs",
        "ok flowControl parallelism peak=2",
        "ok flowControl rate",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(out.contains("NODE ALL OK"), "{out}");
    assert_eq!(emu.publish_requests(), 15, "4 publishJSON + 1 batchJSON + 10 flow-controlled publishJSON");
    assert!(emu.deliveries().iter().any(|d| d.delivered()));
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_works_against_the_emulator() {
    let python = std::env::var_os("REDRIVE_QSTASH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_dir().join("qstash-clients/venv/bin/python"));
    let has_qstash =
        |p: &Path| Command::new(p).args(["-c", "import qstash"]).output().map(|o| o.status.success()).unwrap_or(false);
    let Some(python) = require("python with qstash (PyPI)", python, has_qstash) else { return };
    let emu = emulator().await;
    let before = emu.current_signing_key();
    let mut cmd = Command::new(python);
    cmd.arg(script("python_client.py"));
    let out = run(cmd, &emu).await;
    for line in [
        "ok publish_json+receiver",
        "ok batch_json 2",
        "ok dlq.list+get",
        "ok dlq.delete+delete_many",
        "ok log.list",
        "ok signing_key.rotate",
        "ok flow_control parallelism peak=2",
        "ok flow_control rate",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(out.contains("PYTHON ALL OK"), "{out}");
    assert_ne!(emu.current_signing_key(), before, "the script rotated the keys");
    emu.shutdown().await;
}
