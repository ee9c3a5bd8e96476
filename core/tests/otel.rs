//! Traces with the `otel` feature (`cargo test -p redrive-core --features otel --test otel`): a
//! `tracing` subscriber with an OpenTelemetry layer over an in-memory exporter, a producer span
//! that enqueues, and the worker's exported spans read back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use redrive_core::prelude::*;
use redrive_core::{Backoff, QueueStatsExt};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// Fails its first `fail` attempts, then succeeds.
#[derive(Serialize, Deserialize)]
struct Ship {
    parcel: u32,
    fail: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    const CAP: Option<u32> = Some(2);
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv: &KeyValue| &kv.value)
}

/// The exported spans of job `id`, in the order they ended.
fn spans_of<'a>(spans: &'a [SpanData], id: &JobId) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| attribute(s, "messaging.message.id") == Some(&Value::from(id.0.clone()))).collect()
}

/// The contexts a span links to, by their ids (read from a traceparent, a link's context is remote).
fn links(span: &SpanData) -> Vec<(TraceId, SpanId)> {
    span.links.iter().map(|l| (l.span_context.trace_id(), l.span_context.span_id())).collect()
}

fn attempt(span: &SpanData) -> i64 {
    // An unsigned field may be exported as text.
    match attribute(span, "attempt") {
        Some(Value::I64(n)) => *n,
        Some(Value::String(n)) => n.as_str().parse().unwrap(),
        other => panic!("a job span records its attempt: {other:?}"),
    }
}

// A current-thread runtime: the subscriber set as this thread's default covers the worker's tasks.
#[tokio::test]
async fn a_job_span_follows_its_producer_and_a_record_keeps_the_failing_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("redrive-test")));
    let _default = tracing::subscriber::set_default(subscriber);

    // The producer: a request's span, inside which the jobs are made.
    let producer = tracing::info_span!("checkout");
    let (done, retried, failed) = producer.in_scope(|| {
        let job = |parcel, fail| NewJob::from_job(&Ship { parcel, fail }).unwrap();
        (job(1, 0), job(2, 1), job(3, 2))
    });
    let producer = producer.context().span().span_context().clone();
    assert!(producer.is_valid(), "the layer gives the producer's span a context");
    let expected = format!("00-{}-{}-01", producer.trace_id(), producer.span_id());
    for job in [&done, &retried, &failed] {
        assert_eq!(job.traceparent.as_deref(), Some(expected.as_str()), "a new job carries its span's context");
    }
    // Made outside any span: none to carry.
    assert_eq!(NewJob::from_job(&Ship { parcel: 4, fail: 0 }).unwrap().traceparent, None);

    let backend = MemoryBackend::new();
    let mut ids = Vec::new();
    for job in [done, retried, failed] {
        ids.push(backend.enqueue(job).await.unwrap().id().clone());
    }
    let alerts = Arc::new(Mutex::new(Vec::<Alert>::new()));
    let alerted = Arc::clone(&alerts);
    let worker = Worker::builder(backend.clone(), backend.clone())
        .handle::<Ship>(|job: Ship, ctx: JobContext| async move {
            if ctx.attempt <= job.fail {
                return Err(JobError::retry(format!("parcel {} failed on attempt {}", job.parcel, ctx.attempt)));
            }
            Ok(())
        })
        .backoff(Backoff::NONE)
        .alert_fn(move |alert| {
            alerted.lock().unwrap().push(alert);
            async { Ok(()) }
        })
        .build()
        .start();
    backend.wait_until_drained(Duration::from_secs(10)).await.unwrap();
    for _ in 0..200 {
        if !alerts.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown().await;
    let spans = exporter.get_finished_spans().unwrap();

    // Every job span is a consumer span named and described by the messaging conventions.
    for (id, n) in ids.iter().zip([1, 2, 2]) {
        let of = spans_of(&spans, id);
        assert_eq!(of.len(), n, "one span per attempt of job {id}: {of:#?}");
        for span in of {
            assert_eq!(span.name, "process ship");
            assert_eq!(span.span_kind, SpanKind::Consumer);
            assert_eq!(attribute(span, "messaging.operation.type"), Some(&Value::from("process")));
            assert_eq!(attribute(span, "messaging.system"), Some(&Value::from("redrive_memory")));
            assert_eq!(attribute(span, "messaging.message.id"), Some(&Value::from(id.0.clone())));
            assert_eq!(attribute(span, "messaging.destination.name"), None, "the memory backend names no queue");
        }
    }

    // A first attempt is the producer's child: its trace, its span as the parent.
    for id in &ids {
        let first = spans_of(&spans, id).into_iter().find(|s| attempt(s) == 1).unwrap();
        assert_eq!(first.span_context.trace_id(), producer.trace_id(), "job {id}'s first attempt is in the trace");
        assert_eq!(first.parent_span_id, producer.span_id(), "and the producer's span is its parent");
        assert!(first.links.is_empty());
    }
    // A retry is a trace of its own that links back to the producer.
    let second = spans_of(&spans, &ids[1]).into_iter().find(|s| attempt(s) == 2).unwrap();
    assert_ne!(second.span_context.trace_id(), producer.trace_id(), "a retry starts a trace of its own");
    assert_eq!(second.parent_span_id, SpanId::INVALID, "as a root");
    assert_eq!(links(second), [(producer.trace_id(), producer.span_id())], "linked to the producer's context");

    // The record keeps the failing attempt's trace, not the producer's, and its alert says so.
    let failing = spans_of(&spans, &ids[2]).into_iter().find(|s| attempt(s) == 2).unwrap();
    assert_eq!(links(failing), [(producer.trace_id(), producer.span_id())]);
    let failing_trace = failing.span_context.trace_id().to_string();
    assert_ne!(failing_trace, producer.trace_id().to_string());
    let records = backend.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].job_id, ids[2]);
    assert_eq!(records[0].trace_id.as_deref(), Some(failing_trace.as_str()), "the failing attempt's trace");
    let alerts = alerts.lock().unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].record.trace_id.as_deref(), Some(failing_trace.as_str()));
    assert!(alerts[0].summary().contains(&format!("trace {failing_trace}")), "{}", alerts[0].summary());
}
