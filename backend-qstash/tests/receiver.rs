//! The receiver over a real listener: which signatures it accepts and refuses (the handler never
//! runs for a refused one), a body over the cap, one message delivered twice at once, and the
//! errors a user meets at start and at enqueue.

mod common;

use common::Grant;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use redrive_core::{
    Enqueue, EnqueueExt, ErrorKind, JobContext, JobError, NewJob, QueueStats, Retry, RunningWorker, Worker,
};
use redrive_qstash::{QStashBackend, QStashConfig};
use sha2::{Digest, Sha256};

const CURRENT: &str = "sig_current_0123456789";
const NEXT: &str = "sig_next_0123456789abc";

/// A rig whose receiver accepts `CURRENT` and `NEXT`, with its clock at `now`.
async fn rig() -> common::Rig {
    common::rig_with(common::emulator().signing_keys(CURRENT, NEXT), |c| c.with_signing_keys(CURRENT, NEXT)).await
}

fn claims(sub: &str, body: &[u8], exp_in: i64, nbf_in: i64) -> serde_json::Value {
    let now = chrono::Utc::now().timestamp();
    serde_json::json!({
        "iss": "Upstash", "sub": sub, "iat": now, "exp": now + exp_in, "nbf": now + nbf_in,
        "jti": format!("jwt_{}", uuid()), "body": URL_SAFE.encode(Sha256::digest(body)),
    })
}

/// A fresh id: QStash signs every delivery attempt with a token of its own.
fn uuid() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn sign(alg: Algorithm, key: &str, claims: &serde_json::Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(key.as_bytes()).unwrap()).unwrap()
}

/// A token with the given header and claims and a made-up signature (for algorithms the
/// receiver must refuse before any key is tried).
fn forged(header: serde_json::Value, claims: &serde_json::Value, signature: &str) -> String {
    let part = |v: &serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.{signature}", part(&header), part(claims))
}

fn envelope() -> String {
    let job = NewJob::from_job(&Grant { account: 7 }).unwrap();
    redrive_core::kit::Envelope::new(&job).encode()
}

async fn post(url: &str, signature: Option<&str>, body: String, message_id: &str) -> u16 {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("Upstash-Message-Id", message_id)
        .header("Upstash-Retried", "0")
        .body(body);
    if let Some(signature) = signature {
        request = request.header("Upstash-Signature", signature);
    }
    request.send().await.expect("the receiver answers").status().as_u16()
}

#[tokio::test]
async fn refused_signatures_never_reach_a_handler() {
    let rig = rig().await;
    let url = rig.destination.clone();
    let body = envelope();
    let good = claims(&url, body.as_bytes(), 300, 0);
    let mut changed = body.clone().into_bytes();
    *changed.last_mut().unwrap() = b' ';
    let reserialised =
        serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(&body).unwrap()).unwrap();
    let cases: Vec<(&str, Option<String>, String)> = vec![
        ("a wrong key", Some(sign(Algorithm::HS256, "sig_wrong", &good)), body.clone()),
        ("a one-byte body change", Some(sign(Algorithm::HS256, CURRENT, &good)), String::from_utf8(changed).unwrap()),
        ("re-serialised JSON", Some(sign(Algorithm::HS256, CURRENT, &good)), reserialised),
        (
            "another URL in the subject",
            Some(sign(Algorithm::HS256, CURRENT, &claims("https://evil.example/qstash", body.as_bytes(), 300, 0))),
            body.clone(),
        ),
        (
            "an expired token",
            Some(sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), -60, -400))),
            body.clone(),
        ),
        ("a future nbf", Some(sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 600, 60))), body.clone()),
        ("alg none", Some(forged(serde_json::json!({"alg": "none", "typ": "JWT"}), &good, "")), body.clone()),
        ("HS512", Some(sign(Algorithm::HS512, CURRENT, &good)), body.clone()),
        ("RS256", Some(forged(serde_json::json!({"alg": "RS256", "typ": "JWT"}), &good, "c2lnbmF0dXJl")), body.clone()),
        ("a missing header", None, body.clone()),
    ];
    for (case, signature, body) in cases {
        let status = post(&url, signature.as_deref(), body, "msg_refused").await;
        assert_eq!(status, 401, "{case} should be refused with 401");
    }
    let over = format!("{{\"pad\":\"{}\"}}", "x".repeat(1_000_001));
    let signed = sign(Algorithm::HS256, CURRENT, &claims(&url, over.as_bytes(), 300, 0));
    assert_eq!(post(&url, Some(&signed), over, "msg_big").await, 413, "a body over the cap is refused");
    let counts = rig.backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.running), (0, 0), "no refused delivery was parked for a worker");
}

#[tokio::test]
async fn the_current_key_the_next_key_and_skew_inside_the_leeway_are_accepted() {
    let rig = rig().await;
    let url = rig.destination.clone();
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    let body = envelope();
    let accepted = [
        ("the current key", sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0))),
        ("the next key", sign(Algorithm::HS256, NEXT, &claims(&url, body.as_bytes(), 300, 0))),
        (
            "expired 3 s ago, inside the 5 s leeway",
            sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), -3, -300)),
        ),
        (
            "valid from 3 s on, inside the leeway",
            sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 3)),
        ),
    ];
    for (i, (case, signature)) in accepted.iter().enumerate() {
        let status = post(&url, Some(signature), body.clone(), &format!("msg_ok_{i}")).await;
        assert_eq!(status, 200, "{case} should be accepted");
    }
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one key: the handler ran once, the rest were skipped by the ledger");
}

#[tokio::test]
async fn one_message_delivered_twice_at_once_has_one_effect_and_both_get_2xx() {
    let rig = rig().await;
    let url = rig.destination.clone();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Grant>(move |_job: Grant, _ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .start();
    let body = envelope();
    // Two attempts of one message: QStash signs each with a token of its own.
    let first = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
    let second = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
    let (a, b) = tokio::join!(
        post(&url, Some(&first), body.clone(), "msg_twice"),
        post(&url, Some(&second), body.clone(), "msg_twice")
    );
    assert_eq!((a, b), (200, 200), "both deliveries are answered 2xx");
    // The second waited behind the first's hold as a copy; let it come back and be skipped.
    let stats = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let stats = worker.stats();
            if stats.skipped >= 1 {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the deferred copy comes back and is skipped");
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one effect; stats {stats:?}");
}

#[tokio::test]
async fn start_and_enqueue_errors_are_clear_and_typed() {
    let emulator = common::emulator().quota(Some(1)).start_local().await.unwrap();
    let store = Arc::new(common::ledger().await);
    let destination = "http://127.0.0.1:9/qstash";

    let plain = QStashConfig::new(common::TOKEN, destination).with_api_url(emulator.url());
    let e = QStashBackend::connect(plain, store.clone()).await.err().expect("http refused");
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.message().contains("https"), "{e}");

    let refused = QStashConfig::new("not-the-token", destination).with_api_url(emulator.url()).allow_plain_http();
    let e = QStashBackend::connect(refused, store.clone()).await.err().expect("token refused");
    assert_eq!((e.kind(), e.retry()), (ErrorKind::Config, Retry::Permanent));
    assert!(e.message().contains("refused the token"), "{e}");
    assert!(!e.message().contains("not-the-token"), "the token is never in an error: {e}");

    let config = QStashConfig::new(common::TOKEN, destination).with_api_url(emulator.url()).allow_plain_http();
    let backend = QStashBackend::connect(config, store).await.unwrap();
    backend.enqueue_job(&Grant { account: 1 }).await.expect("the quota has room for one");
    let e = backend.enqueue_job(&Grant { account: 2 }).await.expect_err("the quota is used up");
    assert_eq!((e.kind(), e.retry()), (ErrorKind::Backend, Retry::Permanent), "{e}");
    assert!(e.message().contains("quota"), "{e}");

    let big = NewJob::new(
        "grant",
        redrive_core::IdempotencyKey::parse("grant:account=3").unwrap(),
        serde_json::json!({"pad": "x".repeat(1_000_000)}),
    )
    .unwrap();
    assert_eq!(backend.enqueue(big).await.unwrap_err().kind(), ErrorKind::PayloadTooLarge);
    let greedy = NewJob::from_job(&Grant { account: 4 }).unwrap().with_cap(20);
    assert_eq!(backend.enqueue(greedy).await.unwrap_err().kind(), ErrorKind::Config, "a cap over the plan's retries");
}

#[tokio::test]
async fn after_qstash_rotates_its_keys_twice_deliveries_are_still_accepted() {
    // The backend read the keys at connect; two rotations later QStash signs with a key it
    // has never seen, and the receiver reads the keys again rather than refuse every delivery.
    let rig = common::rig().await;
    rig.emulator.rotate_keys();
    rig.emulator.rotate_keys();
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    rig.backend.enqueue_job(&Grant { account: 11 }).await.unwrap();
    let delivered =
        rig.emulator.wait_until(Duration::from_secs(10), |e| e.deliveries().iter().any(|d| d.delivered())).await;
    worker.shutdown().await;
    assert!(delivered, "the delivery signed with the new current key should be accepted");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let refused = rig.emulator.deliveries().iter().filter(|d| d.status == Some(401)).count();
    assert_eq!(refused, 0, "no delivery was refused on the way");
}

#[tokio::test]
async fn a_delivery_whose_connection_closed_is_never_run() {
    // QStash (or a proxy in front) gave up on the request while it waited for a worker: the
    // job must not run then, since QStash delivers it again.
    let rig = rig().await;
    let url = rig.destination.clone();
    let body = envelope();
    let signature = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let sent = impatient
        .post(&url)
        .header("Upstash-Message-Id", "msg_gone")
        .header("Upstash-Retried", "0")
        .header("Upstash-Signature", &signature)
        .body(body)
        .send()
        .await;
    assert!(sent.is_err(), "no worker: the request waits until the client gives up");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counts = rig.backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.running), (0, 0), "the delivery was forgotten with its connection");
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a job whose request is gone is not run");
}

#[tokio::test]
async fn a_replay_after_retries_starts_over_with_every_attempt_and_a_fresh_history() {
    use redrive_core::{DeadLetter, FailureQuery, Replay};
    let rig = common::rig().await;
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = starts.clone();
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Grant>(move |_job: Grant, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(ctx.attempt);
                Err::<(), JobError>(JobError::retry("the ledger service is down"))
            }
        })
        .backoff(redrive_core::Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(100),
            ..redrive_core::Backoff::default()
        })
        .alert_sweep(Duration::from_millis(200))
        .build()
        .start();
    rig.backend.enqueue(NewJob::from_job(&Grant { account: 21 }).unwrap().with_cap(3)).await.unwrap();
    let open = |backend: QStashBackend| async move { backend.list(&FailureQuery::open()).await.unwrap() };
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(record) = open(rig.backend.clone()).await.pop() {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a failure record after three attempts");
    assert_eq!(first.attempts, 3);
    assert_eq!(first.errors.iter().map(|e| e.attempt).collect::<Vec<_>>(), [1, 2, 3]);
    rig.backend.replay(&first.id, "", "ops").await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(record) = open(rig.backend.clone()).await.into_iter().find(|r| r.id != first.id) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the replayed job fails again to a new record");
    worker.shutdown().await;
    assert_eq!(*starts.lock().unwrap(), [1, 2, 3, 1, 2, 3], "the replay had every attempt again");
    assert_eq!(second.attempts, 3);
    assert_eq!(second.errors.iter().map(|e| e.attempt).collect::<Vec<_>>(), [1, 2, 3], "a fresh history");
}

#[tokio::test]
async fn the_receiver_is_a_plain_tower_service_for_other_frameworks() {
    use tower::ServiceExt as _;
    let rig = rig().await;
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    let body = envelope();
    let request = |signature: Option<String>| {
        let mut builder = axum::http::Request::post("/anywhere")
            .header("Upstash-Message-Id", "msg_tower")
            .header("Upstash-Retried", "0");
        if let Some(signature) = signature {
            builder = builder.header("Upstash-Signature", signature);
        }
        builder.body(axum::body::Body::from(body.clone())).unwrap()
    };
    let unsigned = rig.backend.receiver().oneshot(request(None)).await.unwrap();
    assert_eq!(unsigned.status(), 401);
    let signed = sign(Algorithm::HS256, CURRENT, &claims(&rig.destination, body.as_bytes(), 300, 0));
    let answered = rig.backend.receiver().oneshot(request(Some(signed))).await.unwrap();
    worker.shutdown().await;
    assert_eq!(answered.status(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missing_or_malformed_signature_is_refused_before_the_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rig = rig().await;
    let addr = rig.destination.trim_start_matches("http://").trim_end_matches("/qstash").to_owned();
    let wrong = sign(Algorithm::HS256, "sig_wrong", &claims(&rig.destination, b"{}", 300, 0));
    for (case, signature) in
        [("no signature", None), ("a malformed one", Some("not-a-jwt")), ("another key's", Some(&*wrong))]
    {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let mut head = format!(
            "POST /qstash HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000000\r\nUpstash-Message-Id: msg_slow\r\n"
        );
        if let Some(signature) = signature {
            head.push_str(&format!("Upstash-Signature: {signature}\r\n"));
        }
        head.push_str("\r\n{\"pad\":\"");
        stream.write_all(head.as_bytes()).await.unwrap();
        // The rest of the body never comes: a slow client holding the connection.
        let mut answer = vec![0; 64];
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{case}: no answer while the body is incomplete"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]).into_owned();
        assert!(answer.starts_with("HTTP/1.1 401"), "{case}: refused at once, got {answer:?}");
    }
}

#[tokio::test]
async fn a_captured_delivery_cannot_be_sent_again_nor_its_unsigned_headers_forged() {
    let rig = rig().await;
    let url = rig.destination.clone();
    let (worker, attempts) = recording_worker(&rig);
    let body = envelope();
    let signature = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
    assert_eq!(post(&url, Some(&signature), body.clone(), "msg_captured").await, 200);
    // The same signed request again, inside its token's five minutes, claiming a later attempt.
    let again = reqwest::Client::new()
        .post(&url)
        .header("Upstash-Message-Id", "msg_captured_again")
        .header("Upstash-Retried", "3")
        .header("Upstash-Signature", &signature)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 401, "a token is accepted once");

    // A genuine signature over the body, with carried headers no copy of this backend sealed: an
    // attempt and a history made up by whoever sent it.
    let other = redrive_core::kit::Envelope::new(&NewJob::from_job(&Grant { account: 8 }).unwrap()).encode();
    let signature = sign(Algorithm::HS256, CURRENT, &claims(&url, other.as_bytes(), 300, 0));
    let forged = reqwest::Client::new()
        .post(&url)
        .header("Upstash-Message-Id", "msg_forged")
        .header("Upstash-Retried", "0")
        .header("Redrive-Spent", "4")
        .header("Redrive-Job-Id", "job_forged")
        .header("Upstash-Signature", &signature)
        .body(other)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 200);
    worker.shutdown().await;
    assert_eq!(*attempts.lock().unwrap(), [(7, 1), (8, 1)], "one run each, as first attempts");
}

#[tokio::test]
async fn past_the_park_bound_deliveries_are_answered_503_with_retry_after() {
    // No worker: every delivery would wait its park limit (a minute here) in memory.
    let rig = common::rig_with(common::emulator().signing_keys(CURRENT, NEXT), |c| {
        c.with_signing_keys(CURRENT, NEXT).with_park_limit(Duration::from_secs(60))
    })
    .await;
    let url = rig.destination.clone();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (url, body, client) = (url.clone(), envelope(), client.clone());
        let signature = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
        sent.spawn(async move {
            let request = client
                .post(&url)
                .header("Upstash-Message-Id", format!("msg_burst_{i}"))
                .header("Upstash-Retried", "0")
                .header("Upstash-Signature", signature)
                .body(body);
            // A delivery still held when the client gives up was parked.
            let answer = request.send().await.ok()?;
            let after = answer.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
            Some((answer.status().as_u16(), after))
        });
    }
    let answers = sent.join_all().await;
    let held = answers.iter().filter(|a| a.is_none()).count();
    let refused: Vec<_> = answers.iter().flatten().collect();
    assert_eq!(held, 256, "the bound (256 by default) held, the rest answered");
    assert_eq!(refused.len(), 300 - 256);
    assert!(
        refused
            .iter()
            .all(|(status, after)| *status == 503 && after.as_deref().is_some_and(|a| a.parse::<u64>().is_ok())),
        "past the bound: 503 with Retry-After in seconds, got {refused:?}"
    );
}

#[tokio::test]
async fn a_kind_no_worker_handles_becomes_a_record_after_its_unclaimed_rounds() {
    use redrive_core::{DeadLetter, FailureQuery};
    let rig = common::rig_with(common::emulator(), |c| c.with_park_limit(Duration::from_millis(100))).await;
    let (worker, _) = common::counting_worker::<Grant>(&rig);
    // A kind of a newer release, not handled by this one.
    let job = NewJob::new(
        "invoice",
        redrive_core::IdempotencyKey::parse("invoice:id=1").unwrap(),
        serde_json::json!({"id": 1}),
    )
    .unwrap();
    rig.backend.enqueue(job).await.unwrap();
    let record = tokio::time::timeout(Duration::from_secs(40), async {
        loop {
            if let Some(record) = rig.backend.list(&FailureQuery::open()).await.unwrap().pop() {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("an unclaimed kind ends as a record rather than circulating for ever");
    worker.shutdown().await;
    assert_eq!(record.kind, "invoice");
    assert!(record.last_error.contains("no worker"), "{}", record.last_error);
    let rounds = rig.emulator.deliveries().len();
    assert!(rounds <= 21, "bounded: {rounds} deliveries (20 unclaimed rounds by default)");
}

/// The counterpart: a worker that starts while its kind is paused claims none of its deliveries,
/// and they go back round after round, but none counts towards "handled nowhere": no record
/// after more than the rounds, and once resumed the job runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_paused_before_its_worker_starts_is_no_kind_nothing_handles() {
    use redrive_core::kit::Ledger;
    use redrive_core::{DeadLetter, FailureQuery, Flow, Job};
    let rig = common::rig_with(common::emulator(), |c| {
        c.with_park_limit(Duration::from_millis(100)).with_unclaimed_rounds(2)
    })
    .await;
    let flow = rig.ledger.flow().expect("PostgreSQL keeps a flow store");
    assert!(flow.pause(Grant::KIND, "the ledger service is down", "ana", None).await.unwrap());
    let (worker, runs) = common::counting_worker::<Grant>(&rig);
    rig.backend.enqueue(NewJob::from_job(&Grant { account: 3 }).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = rig.backend.list(&FailureQuery::open()).await.unwrap();
    assert!(records.is_empty(), "a pause makes no record: {records:#?}");
    let rounds = rig.emulator.deliveries().len();
    assert!(rounds >= 3, "the delivery went back round after round: {rounds} deliveries");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran while paused");
    assert!(flow.resume(Grant::KIND, "bo").await.unwrap());
    let ran = tokio::time::timeout(Duration::from_secs(30), async {
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(ran.await.is_ok(), "resumed, the job runs");
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(rig.backend.list(&FailureQuery::open()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_delivery_refused_past_the_park_bound_is_not_charged_an_attempt() {
    let rig = common::rig_with(common::emulator().signing_keys(CURRENT, NEXT), |c| {
        c.with_signing_keys(CURRENT, NEXT).with_max_parked(1)
    })
    .await;
    let url = rig.destination.clone();
    let send = |body: String, message_id: &'static str, retried: &'static str| {
        let signature = sign(Algorithm::HS256, CURRENT, &claims(&url, body.as_bytes(), 300, 0));
        reqwest::Client::new()
            .post(&url)
            .header("Upstash-Message-Id", message_id)
            .header("Upstash-Retried", retried)
            .header("Upstash-Signature", signature)
            .body(body)
            .send()
    };
    // No worker yet: the first delivery holds the one place, the second is refused.
    let first = tokio::spawn(send(envelope(), "msg_holding", "0"));
    let (backend, start) = (rig.backend.clone(), tokio::time::Instant::now());
    while backend.counts().await.unwrap().queued == 0 && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other = redrive_core::kit::Envelope::new(&NewJob::from_job(&Grant { account: 9 }).unwrap()).encode();
    let refused = send(other.clone(), "msg_refused_once", "0").await.unwrap();
    assert_eq!(refused.status().as_u16(), 503);
    let (worker, attempts) = recording_worker(&rig);
    assert_eq!(first.await.unwrap().unwrap().status().as_u16(), 200);
    // QStash's retry of the refused message: its first attempt still, no worker having started it.
    assert_eq!(send(other, "msg_refused_once", "1").await.unwrap().status().as_u16(), 200);
    worker.shutdown().await;
    assert_eq!(*attempts.lock().unwrap(), [(7, 1), (9, 1)]);
}

/// Each run's (account, attempt), in order.
type Attempts = Arc<std::sync::Mutex<Vec<(u32, u32)>>>;

/// A worker on the rig's receiver that records each run's (account, attempt).
fn recording_worker(rig: &common::Rig) -> (RunningWorker, Attempts) {
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Grant>(move |job: Grant, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((job.account, ctx.attempt));
                Ok::<(), JobError>(())
            }
        })
        .build()
        .start();
    (worker, attempts)
}
