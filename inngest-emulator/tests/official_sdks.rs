//! Inngest's official SDKs against the emulator: npm `inngest` (served with `inngest/node`) and
//! PyPI `inngest` (served with Flask), in production mode, installed by `scripts/services`
//! (`REDRIVE_INNGEST_NODE_DIR`, `REDRIVE_INNGEST_PYTHON`). Each app syncs, its SDK's client sends
//! events, and the emulator's calls pass the SDK's signature check (and its answers the
//! emulator's): a function with a step and a sleep completes, an event id sent twice runs once,
//! a function that always throws uses its attempts and its failure handler runs on
//! `inngest/function.failed`, a non-retriable error ends the run at once, and a forged call is
//! refused by the SDK.
//!
//! Under `CI=true` a missing SDK fails the test; elsewhere the test is skipped with a note.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use redrive_inngest_emulator::{Emulator, Run, RunStatus};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

#[derive(Clone, Copy, Debug)]
enum Sdk {
    Js,
    Python,
}

impl Sdk {
    fn app(self) -> &'static str {
        match self {
            Sdk::Js => "js-app",
            Sdk::Python => "py-app",
        }
    }

    /// The command that runs this SDK's script, or `None` (skip) where it is not installed.
    fn command(self) -> Option<Command> {
        let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdks");
        let (var, found) = match self {
            Sdk::Js => {
                let dir = std::env::var_os("REDRIVE_INNGEST_NODE_DIR").map(PathBuf::from);
                ("REDRIVE_INNGEST_NODE_DIR", dir.filter(|d| d.join("inngest/package.json").exists()))
            }
            Sdk::Python => {
                let python = std::env::var_os("REDRIVE_INNGEST_PYTHON").map(PathBuf::from);
                ("REDRIVE_INNGEST_PYTHON", python.filter(|p| p.exists()))
            }
        };
        let Some(found) = found else {
            let msg = format!(
                "{var} is not set to an install of the {self:?} SDK (run scripts/services start, then eval \"$(scripts/services env)\")"
            );
            assert!(!in_ci(), "{msg}");
            eprintln!("SKIPPED: {msg}");
            return None;
        };
        Some(match self {
            Sdk::Js => {
                // An ES module resolves packages from its own directory up, not NODE_PATH: run
                // the script from a link beside the SDK's node_modules.
                let link = found.parent().expect("node_modules has a parent").join("redrive-sdk-check.mjs");
                let _ = std::fs::remove_file(&link);
                std::fs::copy(scripts.join("sdk.mjs"), &link).expect("copy the script beside the SDK");
                let mut cmd = Command::new("node");
                cmd.arg(link);
                cmd
            }
            Sdk::Python => {
                let mut cmd = Command::new(found);
                cmd.arg(scripts.join("sdk.py"));
                cmd
            }
        })
    }
}

fn with_emulator(mut cmd: Command, emu: &Emulator) -> Command {
    cmd.env("EMULATOR_URL", emu.url())
        .env("EMULATOR_SIGNING_KEY", emu.signing_key())
        .env("EMULATOR_EVENT_KEY", emu.event_key())
        .env_remove("INNGEST_DEV")
        .env_remove("INNGEST_BASE_URL")
        .env_remove("INNGEST_SIGNING_KEY")
        .env_remove("INNGEST_EVENT_KEY")
        .kill_on_drop(true);
    cmd
}

/// Starts the SDK's app; returns it and the URL it serves its functions at.
async fn serve(sdk: Sdk, emu: &Emulator) -> Option<(Child, String)> {
    let mut cmd = with_emulator(sdk.command()?, emu);
    let mut child = cmd.arg("serve").stdout(Stdio::piped()).stdin(Stdio::null()).spawn().expect("start the app");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the app started within a minute")
        .expect("read the app's output")
        .expect("the app printed its URL");
    Some((child, url))
}

/// Sends `events` with the SDK's own client; returns the ids the event API answered.
async fn send(sdk: Sdk, emu: &Emulator, events: Value) -> Vec<String> {
    let mut cmd = with_emulator(sdk.command().expect("checked by serve"), emu);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.arg("send").arg(events.to_string()).output())
        .await
        .expect("the send ended within a minute")
        .expect("run the send");
    assert!(out.status.success(), "the SDK's send failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the ids, as JSON")
}

/// Inngest's signature MAC: keyed with the key's text after `signkey-<env>-`, over the body and
/// then the timestamp.
fn mac(key: &str, body: &str, t: i64) -> String {
    use hmac::{KeyInit, Mac};
    let key = key.splitn(3, '-').nth(2).expect("signkey-<env>-<hex>");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    mac.update(t.to_string().as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn of<'a>(runs: &'a [Run], function: &str) -> Vec<&'a Run> {
    runs.iter().filter(|r| r.function_id == function).collect()
}

async fn check(sdk: Sdk) {
    let emu = Emulator::builder().time_scale(0.0).start_local().await.unwrap();
    let Some((_app, url)) = serve(sdk, &emu).await else { return };
    emu.sync(&url).await.expect("the app syncs");
    let app = sdk.app();
    let mut registered: Vec<String> = emu.functions().into_iter().map(|f| f.id).collect();
    registered.sort();
    let want =
        [format!("{app}-flaky"), format!("{app}-flaky-failure"), format!("{app}-greet"), format!("{app}-refuse")];
    assert_eq!(registered, want, "the app's functions, its failure handler among them");

    let greet = json!([{ "name": "app/greet", "id": "order-1", "data": { "name": "ada" } }]);
    let first = send(sdk, &emu, greet.clone()).await;
    let second = send(sdk, &emu, greet).await;
    assert_eq!((first.len(), second.len()), (1, 1));
    let ids = send(sdk, &emu, json!([{ "name": "app/flaky", "data": {} }, { "name": "app/refuse", "data": {} }])).await;
    assert_eq!(ids.len(), 2);

    let (greet_fn, flaky_fn, failure_fn, refuse_fn) =
        (format!("{app}-greet"), format!("{app}-flaky"), format!("{app}-flaky-failure"), format!("{app}-refuse"));
    let runs = emu
        .wait_for_runs(Duration::from_secs(90), |runs| {
            let ended = |f: &str| !of(runs, f).is_empty() && of(runs, f).iter().all(|r| r.status != RunStatus::Running);
            [&greet_fn, &flaky_fn, &failure_fn, &refuse_fn].iter().all(|f| ended(f))
        })
        .await
        .unwrap_or_else(|e| panic!("{sdk:?}: {e}; calls: {:#?}", emu.calls()));

    let greeted = of(&runs, &greet_fn);
    assert_eq!(greeted.len(), 1, "an event id sent twice runs once: {greeted:#?}");
    assert_eq!(greeted[0].status, RunStatus::Completed, "{greeted:#?}");
    assert_eq!(greeted[0].output, Some(json!({ "hello": "ADA" })), "the step's result, after the sleep");

    let calls = emu.calls();
    let attempts = |f: &str| calls.iter().filter(|c| c.function_id == f).map(|c| c.attempt).collect::<Vec<_>>();
    assert_eq!(of(&runs, &flaky_fn)[0].status, RunStatus::Failed);
    assert_eq!(attempts(&flaky_fn), [0, 1, 2], "retries: 2 is three attempts");
    let failure = of(&runs, &failure_fn);
    assert_eq!(failure.len(), 1, "the failure handler ran once: {failure:#?}");
    let output = failure[0].output.clone().expect("the failure handler returned");
    assert_eq!(output["failed"], json!(flaky_fn), "{output}");
    assert!(output["message"].as_str().is_some_and(|m| m.contains("boom on attempt 2")), "the last error: {output}");

    assert_eq!(of(&runs, &refuse_fn)[0].status, RunStatus::Failed);
    assert_eq!(attempts(&refuse_fn), [0], "a non-retriable error is not retried");

    // The SDK refuses a call that the emulator's key did not sign, and one not signed at all.
    let http = reqwest::Client::new();
    let target = format!("{url}?fnId={greet_fn}&stepId=step");
    let body = json!({ "event": { "name": "app/greet", "data": { "name": "eve" }, "id": "x", "ts": 1, "user": {} },
        "events": [], "steps": {}, "use_api": false,
        "ctx": { "run_id": "forged", "attempt": 0, "disable_immediate_execution": false, "use_api": false, "stack": { "stack": [], "current": 0 } } })
    .to_string();
    let now = chrono::Utc::now().timestamp();
    let other_key = format!("t={now}&s={}", mac("signkey-test-00112233", &body, now));
    let stale = format!("t={}&s={}", now - 3600, mac(emu.signing_key(), &body, now - 3600));
    // Python's SDK does not check the timestamp's age (0.5.19); the JS SDK refuses it.
    let stale = matches!(sdk, Sdk::Js).then_some(stale);
    for signature in [Some(other_key), None, Some(format!("t={now}&s=zz"))].into_iter().chain(stale.map(Some)) {
        let mut request = http.post(&target).header("content-type", "application/json").body(body.clone());
        if let Some(signature) = &signature {
            request = request.header("x-inngest-signature", signature);
        }
        let status = request.send().await.unwrap().status();
        assert_eq!(status, 401, "{sdk:?} accepted a call signed {signature:?}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn the_js_sdk_syncs_runs_retries_and_refuses_forged_calls() {
    check(Sdk::Js).await;
}

#[tokio::test]
async fn the_python_sdk_syncs_runs_retries_and_refuses_forged_calls() {
    check(Sdk::Python).await;
}
