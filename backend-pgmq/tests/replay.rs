//! A replay on pgmq takes the record, sends its job and closes the record in one transaction of
//! the one database. Here the record store refuses the close (a trigger, as a failing disk or a
//! killed connection would): nothing is sent, the record is open as it was, and the next replay
//! sends the job once and closes it. Two replays racing send one job.

mod common;

use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, EnqueueExt, Job, KeyBuilder, QueueStats, RecordState, Replay, ReplayOutcome};
use redrive_pgmq::PgmqBackend;
use redrive_postgres::{PgBackend, sqlx};

#[derive(serde::Serialize, serde::Deserialize)]
struct Refund {
    order: u32,
}

impl Job for Refund {
    const KIND: &'static str = "refund";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

/// A job of its own, dead-lettered: its failure record's id.
async fn failed(queue: &PgmqBackend, order: u32) -> redrive_core::FailureId {
    queue.enqueue_job(&Refund { order }).await.unwrap();
    let claimed = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap().remove(0);
    queue.dead_letter(&claimed, "the bank refused the refund").await.unwrap().expect("a record is kept").id
}

async fn in_queue(queue: &PgmqBackend) -> u64 {
    let counts = queue.counts().await.unwrap();
    counts.queued + counts.running
}

async fn sql(store: &PgBackend, statement: String) {
    sqlx::query(sqlx::AssertSqlSafe(statement)).execute(store.pool()).await.unwrap();
}

#[tokio::test]
async fn a_replay_whose_close_fails_sends_nothing_and_leaves_the_record_open() {
    let (queue, store) = common::queue("replay_tx").await;
    let record = failed(&queue, 1).await;
    assert_eq!(in_queue(&queue).await, 0);

    let schema = store.schema().to_owned();
    sql(
        &store,
        format!(
            "CREATE FUNCTION \"{schema}\".refuse_close() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.state = 'replaying' THEN RAISE EXCEPTION 'the disk is full'; END IF; RETURN NEW; END $$"
        ),
    )
    .await;
    sql(
        &store,
        format!(
            "CREATE TRIGGER refuse_close BEFORE UPDATE ON \"{schema}\".broker_records \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse_close()"
        ),
    )
    .await;

    queue.replay(&record, "the bank is back", "ops@example.com").await.expect_err("the close is refused");
    assert_eq!(in_queue(&queue).await, 0, "a replay that did not close sent nothing");
    assert!(queue.get(&record).await.unwrap().state.is_open(), "the record is open at once, not taken for a window");

    sql(&store, format!("DROP TRIGGER refuse_close ON \"{schema}\".broker_records")).await;
    let ReplayOutcome::Replayed(_) = queue.replay(&record, "the bank is back", "ops@example.com").await.unwrap() else {
        panic!("the open record replays");
    };
    assert_eq!(in_queue(&queue).await, 1, "one job sent");
    assert!(
        matches!(queue.get(&record).await.unwrap().state, RecordState::Replaying { .. }),
        "the record is closed by the replay that sent its job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replays_racing_send_one_job() {
    let (queue, _store) = common::queue("replay_race").await;
    let record = failed(&queue, 2).await;
    let (a, b) = (queue.clone(), queue.clone());
    let (ra, rb) = (record.clone(), record.clone());
    let (first, second) = tokio::join!(
        tokio::spawn(async move { a.replay(&ra, "retry", "a@example.com").await }),
        tokio::spawn(async move { b.replay(&rb, "retry", "b@example.com").await }),
    );
    let outcomes = [first.unwrap().unwrap(), second.unwrap().unwrap()];
    let sent = outcomes.iter().filter(|o| matches!(o, ReplayOutcome::Replayed(_))).count();
    assert_eq!(sent, 1, "one replay sends, the other finds the record closed: {outcomes:?}");
    assert_eq!(in_queue(&queue).await, 1);
}
