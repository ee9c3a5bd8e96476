//! A kind's limits said in QStash's own terms: flow control (`Upstash-Flow-Control-Key`,
//! `Upstash-Flow-Control-Value`), so that QStash holds back deliveries the worker would only
//! defer, each deferral a message published again.
//!
//! QStash keeps, per flow-control key, at most `parallelism` deliveries in flight and at most
//! `rate` started per fixed window of `period` (whole seconds, 1 s by default; the PyPI client
//! documents at most a week), holding the rest in a waitlist
//! (<https://upstash.com/docs/qstash/features/flowcontrol>). A kind's `concurrency` maps to
//! `parallelism` as is. Its `rate` maps where QStash never starts more than the worker would:
//! a window never starts more than the rate's burst (`count`), and the rate over time is never
//! above `count / per`:
//!
//! - a period of whole seconds, up to 7 days: as is;
//! - a period over 7 days: a 7-day window with the count scaled down (rounded down); none left
//!   (fewer than one a week) is left to the worker;
//! - a fractional period over 1 s: rounded up to whole seconds, the count kept (a little slower
//!   than the limit over time, never faster);
//! - a period under 1 s: left to the worker. Any window QStash can count with the same burst would
//!   cut the rate to `count` a second, and one with the same rate would start more at once than
//!   the burst, which the worker then defers window after window.
//!
//! Per-key limits (`key_concurrency`, `key_rate`) are not mapped: their key is the typed job's
//! [`limit_key`](redrive_core::Job::limit_key), which a published job does not carry, and a
//! message takes one flow-control key, the kind's. The worker keeps every limit regardless:
//! QStash's only shapes the deliveries.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redrive_core::kit::payload_fingerprint;
use redrive_core::{BoxFuture, Flow, KindFlow, Limits, Rate, Result};
use tokio::time::Instant;
use tracing::warn;

/// How long the kinds' limits read from the store are used before they are read again.
const FRESH: Duration = Duration::from_secs(5);
/// How long an enqueue waits for the store's answer before it publishes without it.
const READ_WITHIN: Duration = Duration::from_secs(2);
/// QStash's longest rate period: a week (PyPI `qstash`'s `FlowControl.period`).
const MAX_PERIOD: u64 = 7 * 24 * 3600;

/// The kinds' limits from a [`Flow`] store, boxed: `Flow`'s methods return `impl Future`, so it
/// cannot be a trait object itself.
pub(crate) trait KindLimits: Send + Sync {
    fn kinds(&self) -> BoxFuture<'_, Result<Vec<KindFlow>>>;
}

impl<F: Flow + 'static> KindLimits for F {
    fn kinds(&self) -> BoxFuture<'_, Result<Vec<KindFlow>>> {
        Box::pin(Flow::kinds(self))
    }
}

/// The store the limits are read from, as the configuration holds it.
#[derive(Clone)]
pub(crate) struct FlowSource(pub(crate) Arc<dyn KindLimits>);

impl fmt::Debug for FlowSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FlowSource(..)")
    }
}

/// The flow-control headers of this destination's messages, from the kinds' limits read at most
/// every [`FRESH`].
pub(crate) struct FlowHeaders {
    source: Option<FlowSource>,
    destination: String,
    /// The kinds' limits and when they were read; one reader at a time, the others wait for it.
    known: tokio::sync::Mutex<Option<(Instant, HashMap<String, Limits>)>>,
}

impl FlowHeaders {
    pub(crate) fn new(source: Option<FlowSource>, destination: &str) -> Self {
        Self { source, destination: destination.to_owned(), known: tokio::sync::Mutex::new(None) }
    }

    /// The headers a message of `kind` carries: none without a store, without limits for the
    /// kind, or with none QStash can hold.
    pub(crate) async fn of(&self, kind: &str) -> Vec<(String, String)> {
        let Some(source) = &self.source else { return Vec::new() };
        let limits = {
            let mut known = self.known.lock().await;
            if known.as_ref().is_none_or(|(at, _)| at.elapsed() >= FRESH) {
                let failed = match tokio::time::timeout(READ_WITHIN, source.0.kinds()).await {
                    Ok(Ok(kinds)) => {
                        *known = Some((Instant::now(), kinds.into_iter().map(|k| (k.kind, k.limits)).collect()));
                        None
                    }
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!("no answer within {READ_WITHIN:?}")),
                };
                if let Some(error) = failed {
                    // The worker still keeps the limits: the messages go out with what was read
                    // last (or unshaped) until the store answers, and enqueues wait for it at
                    // most once every few seconds, briefly.
                    warn!(error = %error, "the kinds' limits could not be read for QStash's flow control");
                    let last = known.take().map(|(_, limits)| limits).unwrap_or_default();
                    *known = Some((Instant::now(), last));
                }
            }
            known.as_ref().and_then(|(_, limits)| limits.get(kind).copied())
        };
        let Some(value) = limits.as_ref().and_then(value) else { return Vec::new() };
        vec![
            ("Upstash-Flow-Control-Key".to_owned(), key(&self.destination, kind)),
            ("Upstash-Flow-Control-Value".to_owned(), value),
        ]
    }
}

/// The flow-control key of `kind` at `destination`: QStash's keys are the account's, so two apps
/// (or staging and production) on one token, sending the same kind, get two keys. Letters,
/// digits and `-`, 40 characters.
pub(crate) fn key(destination: &str, kind: &str) -> String {
    let digest = payload_fingerprint(&serde_json::json!(["redrive-flow", destination, kind]));
    format!("redrive-{}", &digest[..32])
}

/// `parallelism=…, rate=…, period=…s` for the limits QStash can hold; `None` when none.
pub(crate) fn value(limits: &Limits) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(n) = limits.concurrency {
        parts.push(format!("parallelism={n}"));
    }
    if let Some((count, secs)) = limits.rate.and_then(window) {
        parts.push(format!("rate={count}, period={secs}s"));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The fixed window (count, seconds) QStash holds `rate` to, never starting more than the rate's
/// burst at once nor more over time; `None` where that is none (module docs).
pub(crate) fn window(rate: Rate) -> Option<(u32, u64)> {
    if rate.count == 0 || rate.per < Duration::from_secs(1) {
        return None;
    }
    let secs = rate.per.as_secs() + u64::from(rate.per.subsec_nanos() > 0);
    if secs <= MAX_PERIOD {
        return Some((rate.count, secs));
    }
    let scaled = u128::from(rate.count) * u128::from(MAX_PERIOD) * 1_000_000_000 / rate.per.as_nanos();
    let count = u32::try_from(scaled).unwrap_or(u32::MAX);
    (count > 0).then_some((count, MAX_PERIOD))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u32, per_ms: u64) -> Rate {
        Rate { count, per: Duration::from_millis(per_ms) }
    }

    #[test]
    fn whole_seconds_map_as_they_are() {
        assert_eq!(window(Rate::per_second(10)), Some((10, 1)));
        assert_eq!(window(Rate::per_minute(600)), Some((600, 60)));
        assert_eq!(window(rate(5, MAX_PERIOD * 1000)), Some((5, MAX_PERIOD)));
    }

    #[test]
    fn what_qstash_cannot_say_is_never_looser() {
        // Rounded up: the same burst, a little slower over time.
        assert_eq!(window(rate(3, 1500)), Some((3, 2)));
        // Over a week: scaled down into a week.
        assert_eq!(window(rate(30, 14 * 24 * 3600 * 1000)), Some((15, MAX_PERIOD)));
        assert_eq!(window(rate(1, 8 * 24 * 3600 * 1000)), None, "less than one a week: the worker's");
        // Under a second: the worker's.
        assert_eq!(window(rate(5, 250)), None);
        assert_eq!(window(rate(1000, 999)), None);
        for r in [rate(3, 1500), rate(7, 2001), rate(30, 14 * 24 * 3600 * 1000), rate(u32::MAX, 10_000_000_000)] {
            let (count, secs) = window(r).unwrap();
            assert!(count <= r.count, "{r}: a window starts no more than the burst");
            let over_time = f64::from(count) / secs as f64;
            assert!(over_time <= f64::from(r.count) / r.per.as_secs_f64(), "{r}: no faster over time");
        }
    }

    #[test]
    fn the_value_names_what_qstash_holds() {
        let both = Limits { concurrency: Some(2), rate: Some(Rate::per_minute(10)), ..Limits::default() };
        assert_eq!(value(&both).as_deref(), Some("parallelism=2, rate=10, period=60s"));
        let per_key_only =
            Limits { key_concurrency: Some(1), key_rate: Some(Rate::per_second(1)), ..Limits::default() };
        assert_eq!(value(&per_key_only), None, "per-key limits stay with the worker");
        let sub_second = Limits { concurrency: Some(4), rate: Some(rate(5, 250)), ..Limits::default() };
        assert_eq!(value(&sub_second).as_deref(), Some("parallelism=4"));
        assert_eq!(value(&Limits::default()), None);
    }

    #[test]
    fn keys_are_the_destinations_and_the_kinds() {
        let a = key("https://a.example.com/qstash", "send_receipt");
        assert_eq!(a.len(), 40);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(a, key("https://a.example.com/qstash", "send_receipt"), "stable across processes");
        assert_ne!(a, key("https://b.example.com/qstash", "send_receipt"));
        assert_ne!(a, key("https://a.example.com/qstash", "charge"));
    }
}
