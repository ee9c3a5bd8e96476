//! Trace context: the producer's W3C `traceparent`, carried with its job whatever the features,
//! so that what is stored never depends on one. The `otel` feature reads and follows it (see
//! [`otel`](self::otel)); without it the job carries it and its failure record keeps its trace id.

/// Why `traceparent` is not a W3C trace context the job can carry, or `None` if it is one:
/// version `00`, a 32-hex trace id and a 16-hex parent id that are not all zeros, 2-hex flags,
/// lower case, joined by `-` (<https://www.w3.org/TR/trace-context/#traceparent-header>).
pub(crate) fn invalid(traceparent: &str) -> Option<&'static str> {
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace_id, parent_id, flags] = parts[..] else {
        return Some("it is not four fields joined by `-`");
    };
    let hex =
        |field: &str, len: usize| field.len() == len && field.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if version != "00" {
        return Some("its version is not 00");
    }
    if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
        return Some("its trace id is not 32 lower-case hex digits, not all zero");
    }
    if !hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
        return Some("its parent id is not 16 lower-case hex digits, not all zero");
    }
    if !hex(flags, 2) {
        return Some("its flags are not 2 lower-case hex digits");
    }
    None
}

/// The trace id (32 hex digits) of a valid `traceparent`, else `None`.
pub(crate) fn trace_id(traceparent: &str) -> Option<&str> {
    match invalid(traceparent) {
        None => traceparent.get(3..35),
        Some(_) => None,
    }
}

/// The OpenTelemetry side: the producer's context read from the current `tracing` span, the job's
/// span made its child or linked to it, and the trace id of a failing attempt. Every conversion
/// between a context and its `traceparent` goes through the W3C `TraceContextPropagator`.
#[cfg(feature = "otel")]
pub(crate) mod otel {
    use std::collections::HashMap;

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::job::JobRecord;

    const HEADER: &str = "traceparent";

    /// The `traceparent` of `span`'s OpenTelemetry context; `None` where it has none (no
    /// OpenTelemetry layer in the subscriber, or no span).
    pub(crate) fn traceparent_of(span: &tracing::Span) -> Option<String> {
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.remove(HEADER).filter(|t| super::invalid(t).is_none())
    }

    /// Makes the job's span (a root: see `job_span`) the child of its producer's context on the
    /// job's first attempt, and links it to that context on a retry or a replay, as
    /// OpenTelemetry's messaging conventions say: a later delivery is a trace of its own that
    /// points back at what produced it. A job without a context is left a root.
    pub(crate) fn follow(span: &tracing::Span, job: &JobRecord) {
        let Some(traceparent) = &job.traceparent else { return };
        let carrier = HashMap::from([(HEADER.to_owned(), traceparent.clone())]);
        let producer = TraceContextPropagator::new().extract(&carrier);
        let context = producer.span().span_context().clone();
        if !context.is_valid() {
            return;
        }
        if job.attempt <= 1 && job.replay_of.is_none() {
            // Refused only where the span is disabled or has no OpenTelemetry layer: nothing to join.
            let _ = span.set_parent(producer);
        } else {
            span.add_link(context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_checked_field_by_field() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(invalid(good), None);
        assert_eq!(trace_id(good), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(invalid("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), None, "not sampled");
        for (bad, why) in [
            ("", "four fields"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "four fields"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "four fields"),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "trace id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "trace id"),
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "trace id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "trace id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "parent id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01", "parent id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", "flags"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", "flags"),
        ] {
            let said = invalid(bad).unwrap_or_else(|| panic!("{bad:?} passed"));
            assert!(said.contains(why), "{bad:?}: {said}");
            assert_eq!(trace_id(bad), None, "{bad:?}");
        }
    }
}

#[cfg(all(test, feature = "otel"))]
mod otel_tests {
    use opentelemetry::trace::{SpanId, TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use serde_json::json;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::otel::{follow, traceparent_of};
    use crate::backend::FailureId;
    use crate::job::{JobId, NewJob};
    use crate::key::IdempotencyKey;
    use crate::kit::Envelope;

    /// A first delivery is the producer's child; a retry and a broker's replay (its attempt 1,
    /// carrying `replay_of`) are roots linked to it.
    #[test]
    fn a_first_attempt_is_a_child_and_a_retry_or_a_replay_a_linked_root() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("redrive-test")));
        tracing::subscriber::with_default(subscriber, || {
            let producer = tracing::info_span!("checkout");
            let traceparent = traceparent_of(&producer).expect("a context");
            let producer = producer.context().span().span_context().clone();
            let key = IdempotencyKey::builder("ship").fact("parcel", 1).build().unwrap();
            let new = NewJob::new("ship", key, json!({})).unwrap().with_traceparent(traceparent).unwrap();
            let job = |attempt, replay_of: Option<&str>| {
                let new = NewJob { replay_of: replay_of.map(|r| FailureId(r.into())), ..new.clone() };
                Envelope::new(&new).into_job(JobId("m-1".into()), attempt, None)
            };
            for (name, job) in [("first", job(1, None)), ("retry", job(2, None)), ("replay", job(1, Some("r-1")))] {
                let span = tracing::info_span!(parent: None, "job", name);
                follow(&span, &job);
                drop(span);
                let spans = exporter.get_finished_spans().unwrap();
                let span = spans.last().unwrap();
                // Read from the job's traceparent, the link's context is remote: compared by its ids.
                let links: Vec<_> =
                    span.links.iter().map(|l| (l.span_context.trace_id(), l.span_context.span_id())).collect();
                if name == "first" {
                    assert_eq!(span.span_context.trace_id(), producer.trace_id(), "{name}");
                    assert_eq!(span.parent_span_id, producer.span_id(), "{name}");
                    assert!(links.is_empty(), "{name}");
                } else {
                    assert_ne!(span.span_context.trace_id(), producer.trace_id(), "{name}");
                    assert_eq!(span.parent_span_id, SpanId::INVALID, "{name}");
                    assert_eq!(links, [(producer.trace_id(), producer.span_id())], "{name}");
                }
            }
            // Without a layer's context, a span has no traceparent.
            assert_eq!(traceparent_of(&tracing::Span::none()), None);
        });
    }
}
