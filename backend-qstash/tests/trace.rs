//! The trace id a record keeps: the one the worker hands over with the job it dead-letters (the
//! failing attempt's, with the `otel` feature), carried to the DLQ entry in the 489's headers,
//! not the one of the body's traceparent.

mod common;

use std::time::Duration;

use common::Grant;
use redrive_core::kit::{Claim, Claimed, Kinds};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, JobRecord, NewJob};

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const FAILING: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test]
async fn a_record_keeps_the_trace_the_job_was_dead_lettered_with() {
    let rig = common::rig().await;
    let job = NewJob::from_job(&Grant { account: 1 }).unwrap().with_traceparent(PRODUCER).unwrap();
    rig.backend.enqueue(job).await.unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let kinds = Kinds::Only(vec!["grant".into()]);
            if let Some(c) =
                rig.backend.claim(&kinds, 1, Duration::from_secs(5), Duration::from_millis(200)).await.unwrap().pop()
            {
                return c;
            }
        }
    })
    .await
    .expect("the delivery is parked");
    assert_eq!(claimed.job.traceparent.as_deref(), Some(PRODUCER), "the delivery carries the producer's context");
    // As the worker hands a failing retry over: its own trace in place of the producer's.
    let failing = Claimed { job: JobRecord { traceparent: Some(FAILING.into()), ..claimed.job.clone() }, ..claimed };
    assert_eq!(rig.backend.dead_letter(&failing, "declined").await.unwrap(), None, "QStash writes the record");
    let record = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(record) = rig.backend.list(&FailureQuery::open()).await.unwrap().pop() {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the DLQ entry is listed as a record");
    assert_eq!(record.last_error, "declined");
    assert_eq!(record.trace_id.as_deref(), Some("0af7651916cd43dd8448eb211c80319c"), "the failing attempt's trace");
}
