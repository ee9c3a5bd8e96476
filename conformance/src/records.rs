//! The checks every [`RecordStore`] passes, for the stores' own tests.

use std::time::Duration;

use redrive_core::kit::{RecordStore, Taken};
use redrive_core::{FailureQuery, RecordState};

use crate::sample_record as record;

/// Panics unless `store` keeps records once by id and scoped by queue, reads them back as
/// written, gives a replay's take to one caller, gives it back or closes it, keeps a replayed
/// record replaying (with who and why) until it is confirmed, or until a new record that names it
/// settles it as failed again (also when the job settles before the replay closes it), reopens a
/// take whose window lapsed, pages in the order kept, finds text with quotes and newlines, finds
/// records by their error text (without case, wildcards as themselves), and purges by age. Give
/// it a store with no records of the queue
/// `arn:aws:sqs:us-east-1:000000000000:jobs`.
pub async fn check_record_store(store: &impl RecordStore) {
    let queue = "arn:aws:sqs:us-east-1:000000000000:jobs";
    let records = [record(1, serde_json::json!({"parcel": 1})), record(2, serde_json::json!({"note": "say \"hi\"\n"}))];
    assert_eq!(store.keep_records(queue, &records).await.unwrap(), 2);
    assert_eq!(store.keep_records(queue, &records).await.unwrap(), 0, "kept once by id");
    assert_eq!(store.open_records("another-queue").await.unwrap(), 0, "scoped by queue");
    let read = store.record(queue, &records[1].id).await.unwrap();
    assert_eq!((&read.payload, &read.errors, &read.key), (&records[1].payload, &records[1].errors, &records[1].key));

    let id = &records[0].id;
    let window = Duration::from_secs(300);
    assert!(matches!(store.take_for_replay(queue, id, window).await.unwrap(), Taken::Record(_)));
    let second = store.take_for_replay(queue, id, window).await.unwrap();
    assert!(matches!(second, Taken::Closed(RecordState::Replaying { .. })), "{second:?}");
    assert_eq!(store.open_records(queue).await.unwrap(), 1, "a taken record is not open");
    // A send that surely failed gives the take back: open again at once.
    assert_eq!(store.close_record(queue, id, &RecordState::Open).await.unwrap(), None);
    assert_eq!(store.record(queue, id).await.unwrap().state, RecordState::Open);
    assert!(matches!(store.take_for_replay(queue, id, window).await.unwrap(), Taken::Record(_)));
    let replayed = RecordState::replaying("fixed", "ops", false);
    assert_eq!(store.close_record(queue, id, &replayed).await.unwrap(), None);
    let kept = store.record(queue, id).await.unwrap().state;
    assert!(
        matches!(&kept, RecordState::Replaying { reason, actor, .. } if reason == "fixed" && actor == "ops"),
        "a replay keeps who and why: {kept:?}"
    );
    let discarded = RecordState::Discarded { at: chrono::Utc::now(), reason: "dup".into(), actor: "ops".into() };
    let before = store.close_record(queue, id, &discarded).await.unwrap();
    assert!(matches!(before, Some(RecordState::Replaying { .. })), "a replayed record stays replayed: {before:?}");
    // Its job's effect done: confirmed, who and why kept; confirmed once.
    assert!(store.confirm_record(queue, id).await.unwrap());
    assert!(!store.confirm_record(queue, id).await.unwrap(), "confirmed once");
    let confirmed = store.record(queue, id).await.unwrap().state;
    assert!(
        matches!(&confirmed, RecordState::Confirmed { reason, actor, confirmed_at, at, .. }
            if reason == "fixed" && actor == "ops" && confirmed_at >= at),
        "a confirmed replay keeps who and why: {confirmed:?}"
    );
    assert_eq!(store.open_records(queue).await.unwrap(), 1, "a confirmed record is not open");

    // A take whose replayer died reads as open once its window lapses.
    let other = &records[1].id;
    assert!(matches!(store.take_for_replay(queue, other, Duration::ZERO).await.unwrap(), Taken::Record(_)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.record(queue, other).await.unwrap().state, RecordState::Open);
    let open = store.records(queue, &FailureQuery::open()).await.unwrap();
    assert_eq!(open.iter().map(|r| &r.id).collect::<Vec<_>>(), [other], "the lapsed take lists as open");

    let page = store.records(queue, &FailureQuery { limit: 1, ..FailureQuery::default() }).await.unwrap();
    let next = FailureQuery { limit: 1, after: Some(page[0].id.clone()), ..FailureQuery::default() };
    assert_eq!(store.records(queue, &next).await.unwrap()[0].id, *other, "pages in the order kept");
    assert!(store.records_mention(queue, "say \"hi\"\n").await.unwrap(), "text with quotes and a newline is found");

    // The error text: without case, its `%` and `_` as themselves.
    let quota = redrive_core::FailureRecord {
        last_error: "Quota at 100% for tenant a_b".into(),
        // And the failing trace, kept as written.
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        ..record(3, serde_json::json!({"parcel": 3}))
    };
    assert_eq!(store.keep_records(queue, std::slice::from_ref(&quota)).await.unwrap(), 1);
    assert_eq!(store.record(queue, &quota.id).await.unwrap().trace_id, quota.trace_id, "the trace id is kept");
    let by_error = |text: &str| FailureQuery { error_contains: Some(text.to_owned()), ..FailureQuery::default() };
    for (text, expected) in [
        ("CARRIER rejected", vec![&records[0].id, &records[1].id]),
        ("quota AT 100%", vec![&quota.id]),
        ("tenant a_b", vec![&quota.id]),
        ("q%a", vec![]),
        ("t_nant", vec![]),
        ("100%%", vec![]),
    ] {
        let found = store.records(queue, &by_error(text)).await.unwrap();
        assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), expected, "records whose error holds {text:?}");
    }

    // A replayed job that fails again: its new record names the old one, kept in one write that
    // settles the old one as failed again, naming the new one.
    assert!(matches!(store.take_for_replay(queue, other, window).await.unwrap(), Taken::Record(_)));
    assert_eq!(store.close_record(queue, other, &RecordState::replaying("retry", "ana", false)).await.unwrap(), None);
    let again = redrive_core::FailureRecord { replay_of: Some(other.clone()), ..record(4, serde_json::json!({})) };
    assert_eq!(store.keep_records(queue, std::slice::from_ref(&again)).await.unwrap(), 1);
    let old = store.record(queue, other).await.unwrap().state;
    assert!(
        matches!(&old, RecordState::FailedAgain { next, reason, actor, .. }
            if *next == again.id && reason == "retry" && actor == "ana"),
        "the replayed record names the new one: {old:?}"
    );
    assert!(!store.confirm_record(queue, other).await.unwrap(), "a record that failed again is never confirmed");
    let new = store.record(queue, &again.id).await.unwrap();
    assert_eq!((new.replay_of.as_ref(), new.state.is_open()), (Some(other), true), "the new record names the old");

    // A replayed job can settle before its replay closes the record (it ran at once): the close
    // adds who and why.
    assert!(matches!(store.take_for_replay(queue, &again.id, window).await.unwrap(), Taken::Record(_)));
    assert!(store.confirm_record(queue, &again.id).await.unwrap(), "a taken record is confirmed");
    assert_eq!(store.close_record(queue, &again.id, &RecordState::replaying("fast", "bo", false)).await.unwrap(), None);
    let raced = store.record(queue, &again.id).await.unwrap().state;
    assert!(
        matches!(&raced, RecordState::Confirmed { reason, actor, .. } if reason == "fast" && actor == "bo"),
        "the replay's close keeps who and why on a record its job confirmed first: {raced:?}"
    );
    assert_eq!(store.purge_records(queue, Duration::ZERO).await.unwrap(), 4);
    assert!(!store.records_mention(queue, "say \"hi\"").await.unwrap());
}
