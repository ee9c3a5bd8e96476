//! The `redrive` command on Inngest (the emulator, in this process) as an operator runs it: the
//! records of the workers' app listed, shown, replayed (a new event under an id of its own, run
//! once) and discarded, with the records' states in PostgreSQL.

mod common;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{database, redrive_command};
use redrive_core::{DeadLetter, EnqueueExt, Job, JobContext, JobError, KeyBuilder, Worker};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Serialize, Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_replays_and_discards_inngest_records() {
    let store = database().await;
    let shop = common::InngestApp::start(&store, "shop").await;
    let backend = shop.backend.clone();
    backend.sync().await.unwrap();

    let (carrier_down, shipped) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU32::new(0)));
    let (down, count) = (carrier_down.clone(), shipped.clone());
    let worker = Worker::builder(backend.clone(), store.clone())
        .handle::<Ship>(move |_job: Ship, _ctx: JobContext| {
            let (down, count) = (down.clone(), count.clone());
            async move {
                if down.load(Ordering::SeqCst) {
                    return Err(JobError::permanent("carrier refused the label"));
                }
                count.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .build()
        .start();
    backend.enqueue_job(&Ship { parcel: 1 }).await.unwrap();
    backend.enqueue_job(&Ship { parcel: 2 }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        while backend.count_open().await.unwrap() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("both jobs end as records");

    let target = shop.url();
    let redrive = |args: &[&str]| {
        redrive_command(&target, store.schema()).envs(shop.env()).args(args).output().expect("the redrive binary runs")
    };
    let listed = json(&redrive(&["--json", "failed", "list", "--kind", "ship"]));
    let records = listed.as_array().expect("a list");
    assert_eq!(records.len(), 2, "{listed}");
    assert!(records.iter().all(|r| r["last_error"] == "carrier refused the label"), "{listed}");
    let (first, second) =
        (records[0]["id"].as_str().unwrap().to_owned(), records[1]["id"].as_str().unwrap().to_owned());
    let shown = json(&redrive(&["--json", "failed", "show", &first]));
    assert!(shown["payload"]["parcel"].is_u64(), "the payload is shown: {shown}");

    carrier_down.store(false, Ordering::SeqCst);
    assert_eq!(json(&redrive(&["--json", "replay", &first, "--by", "ada"]))["replayed"], true);
    assert_eq!(
        json(&redrive(&["--json", "replay", &first, "--by", "ada"]))["replayed"],
        false,
        "a second replay sends nothing"
    );
    let discarded = json(&redrive(&["--json", "discard", &second, "--reason", "shipped by hand", "--by", "ada"]));
    assert_eq!(discarded["state"]["actor"], "ada", "{discarded}");
    tokio::time::timeout(Duration::from_secs(20), async {
        while shipped.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the replayed job runs");
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.shutdown().await;
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "the replayed job ran once, the discarded one never");
    assert_eq!(json(&redrive(&["--json", "failed", "count"]))["open_records"], 0);
    // Inngest's URL without its keys is refused with the variable to set, never a URL.
    let refused = redrive_command(&target, store.schema())
        .env_remove("INNGEST_EVENT_KEY")
        .env_remove("INNGEST_SIGNING_KEY")
        .args(["failed", "count"])
        .output()
        .unwrap();
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("INNGEST_EVENT_KEY"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
