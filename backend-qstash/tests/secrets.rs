//! QStash's secrets never in a log line: the API token, the signing keys, and any delivery's
//! signature (a JWT, good for minutes to whoever holds it), through a job done, a job recorded
//! and discarded, and deliveries refused for their signatures, with everything redrive logs
//! down to trace and the rest at debug.

mod common;

use common::Grant;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, JobContext, JobError, NewJob, Worker};
use sha2::{Digest, Sha256};

const CURRENT: &str = "sig_current_canary_7d1c";
const NEXT: &str = "sig_next_canary_42aa";
/// How every JWT begins: `{"alg":` in base64url.
const JWT: &str = "eyJhbGciOi";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A delivery signed with `key` (a wrong one, or expired when `exp_in` is negative).
async fn refused(url: &str, key: &str, exp_in: i64) -> u16 {
    let body = redrive_core::kit::Envelope::new(&NewJob::from_job(&Grant { account: 9 }).unwrap()).encode();
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({
        "iss": "Upstash", "sub": url, "iat": now, "exp": now + exp_in, "nbf": now - 400,
        "jti": "jwt_secret_test", "body": URL_SAFE.encode(Sha256::digest(body.as_bytes())),
    });
    let signature = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(key.as_bytes()).unwrap(),
    )
    .unwrap();
    reqwest::Client::new()
        .post(url)
        .header("Upstash-Message-Id", "msg_refused")
        .header("Upstash-Retried", "0")
        .header("Upstash-Signature", signature)
        .body(body)
        .send()
        .await
        .expect("the receiver answers")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_signing_key_or_signature_in_a_log_line() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("debug,redrive=trace"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let rig =
        common::rig_with(common::emulator().signing_keys(CURRENT, NEXT), |c| c.with_signing_keys(CURRENT, NEXT)).await;
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Grant>(|job: Grant, _ctx: JobContext| async move {
            if job.account == 2 { Err(JobError::permanent("the account is closed")) } else { Ok(()) }
        })
        .build()
        .start();
    for account in [1, 2] {
        rig.backend.enqueue(NewJob::from_job(&Grant { account }).unwrap()).await.unwrap();
    }
    wait_for("the failure record", async || rig.backend.count_open().await.unwrap() == 1).await;
    let record = rig.backend.list(&FailureQuery::open()).await.unwrap().remove(0);
    rig.backend.discard(&record.id, "closed account", "ada").await.unwrap();
    assert_eq!(refused(&rig.destination, "sig_wrong_key", 300).await, 401, "a wrong key is refused");
    assert_eq!(refused(&rig.destination, CURRENT, -60).await, 401, "an expired signature is refused");
    worker.shutdown().await;

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("grant:account=2"), "the capture should see the worker's lines about the jobs");
    assert!(logs.contains("signature does not hold"), "the capture should see the refusals");
    for (what, secret) in [("the API token", common::TOKEN), ("a signing key", CURRENT), ("a signing key", NEXT)] {
        assert!(!logs.contains(secret), "{what} was written to the log");
    }
    assert!(!logs.contains(JWT), "a signature (JWT) was written to the log");
}
