//! Cross-client: jobs sent by pgmq's official Python client (PyPI `pgmq`, installed by
//! `scripts/services`) run once on the Rust worker, and what the worker leaves of a job that
//! failed for good (its record, its archived message) reads from Python as docs/envelope.md
//! says. A missing client fails the test; it never skips.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::{Job, JobContext, JobError, KeyBuilder, Worker};
use serde_json::{Value, json};

#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn python(args: &[&str]) -> String {
    let python = std::env::var("REDRIVE_PGMQ_PYTHON")
        .expect("REDRIVE_PGMQ_PYTHON names a python with PyPI pgmq (eval \"$(scripts/services env)\")");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pgmq_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(common::database_url())
        .args(args)
        .output()
        .expect("the pgmq client's python runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn envelope(parcel: u32, cap: u32) -> String {
    json!({
        "v": 1, "kind": "ship", "key": format!("ship:parcel={parcel}"),
        "provider_key": "6f1c1d2e-8c1b-4a57-9a3e-2f0d6c1b7e11", "cap": cap,
        "enqueued_at": "2026-11-29T19:00:00.000Z", "payload": {"parcel": parcel}
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_s_messages_run_once_and_its_failures_read_from_python() {
    let (queue, store) = common::queue("py").await;
    let name = queue.queue_name().to_owned();
    python(&["send", &name, &envelope(1, 3)]);
    python(&["send", &name, &envelope(2, 3)]);

    let shipped = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&shipped);
    let worker = Worker::builder(queue.clone(), store.clone())
        .handle::<Ship>(move |job: Ship, _ctx: JobContext| {
            let counted = Arc::clone(&counted);
            async move {
                if job.parcel == 2 {
                    return Err(JobError::retry("the carrier refused parcel 2"));
                }
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .lease(Duration::from_secs(5))
        .poll(Duration::from_millis(100))
        .backoff(redrive_core::Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(50),
            ..redrive_core::Backoff::default()
        })
        .build()
        .start();
    let scope = queue.record_scope().to_owned();
    let mut records = Value::Null;
    for _ in 0..300 {
        records = serde_json::from_str(&python(&["records", store.schema(), &scope])).unwrap();
        if shipped.load(Ordering::SeqCst) == 1 && records.as_array().is_some_and(|r| r.len() == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.shutdown().await;
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "parcel 1 ran once");

    // The record, read with SQL from Python: the key, every attempt, the last error.
    let records = records.as_array().expect("a list").clone();
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record["key"], "ship:parcel=2");
    assert_eq!(record["record"]["attempts"], 3, "{record}");
    assert_eq!(record["record"]["last_error"], "the carrier refused parcel 2");
    assert_eq!(record["record"]["payload"], json!({"parcel": 2}));
    // The message, archived with the two earlier attempts' errors in its headers.
    let archived: Value = serde_json::from_str(&python(&["archived", &name])).unwrap();
    let archived = archived.as_array().unwrap();
    assert_eq!(archived.len(), 1, "{archived:?}");
    assert_eq!(archived[0]["msg_id"].to_string(), record["id"].as_str().unwrap());
    assert_eq!(archived[0]["message"]["key"], "ship:parcel=2");
    assert_eq!(archived[0]["headers"]["redrive"]["errors"].as_array().map(Vec::len), Some(2), "{archived:?}");
    let metrics: Value = serde_json::from_str(&python(&["metrics", &name])).unwrap();
    assert_eq!(metrics["queue_length"], 0, "{metrics}");
}
