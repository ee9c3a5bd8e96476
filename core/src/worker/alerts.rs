//! Alerts, at least once per record and sink, de-duplicated by record id.
//!
//! Sending an alert is an effect like any other, so it goes through the effect ledger under the
//! key `redrive_alert:record=<id>:sink=<n>`: the first attempt holds the key, sends, and marks it
//! done. A sink that fails is retried with backoff, then left to the sweep; a worker that dies
//! between the record and its alert leaves the key free (or its hold lapses), and the next
//! worker's sweep sends it. Two workers never both send one record's alert to one sink, and a
//! worker that died mid-send is the only way a sink sees an alert twice.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::{Count, Shared};
use crate::alert::{Alert, AlertSink};
use crate::backend::{Begin, Claim, DeadLetter, FailureId, FailureQuery, FailureRecord, Ledger};
use crate::key::{IdempotencyKey, ProviderKey};
use crate::policy::Backoff;

/// The part of the worker that alerts: the sinks, and the signal that a record is on its way.
pub(super) struct Alerting {
    pub(super) sinks: Vec<Arc<dyn AlertSink>>,
    /// A job handed to a service that writes its record later (QStash): the sweep looks soon.
    handed_off: Notify,
}

impl Alerting {
    pub(super) fn new(sinks: Vec<Arc<dyn AlertSink>>) -> Self {
        Self { sinks, handed_off: Notify::new() }
    }

    /// A job was handed to a service that writes its record later: the sweep looks soon.
    pub(super) fn handed_off(&self) {
        self.handed_off.notify_one();
    }
}

/// The job kind of alert keys in the ledger.
pub(super) const ALERT_KIND: &str = "redrive_alert";

/// How long one delivery holds its key: longer than its retries take.
const ALERT_HOLD: Duration = Duration::from_secs(60);

/// Reminders per record at most: each is a ledger key, which a purge names whole (by primary key).
pub(super) const MAX_REMINDERS: u32 = 16;

/// Tries per delivery before it is left to the next sweep.
const ALERT_TRIES: u32 = 4;

/// The ledger key of one record's alert (`reminder` 0) or n-th reminder to sink number `sink`.
pub(crate) fn alert_key(record: &FailureId, sink: usize, reminder: u32) -> Option<IdempotencyKey> {
    let key = IdempotencyKey::builder(ALERT_KIND).fact("record", &record.0).fact("sink", sink);
    let key = if reminder == 0 { key } else { key.fact("reminder", reminder) };
    key.build().ok()
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// Alerts every sink about `record`, unless it has been (or is being) alerted already.
    pub(super) async fn alert(&self, record: FailureRecord) {
        self.announce(record, 0).await;
    }

    /// Sends the record's alert (`reminder` 0) or its n-th reminder to every sink, once each.
    async fn announce(&self, record: FailureRecord, reminder: u32) {
        let alert = Alert { record, raised_at: Utc::now(), reminder };
        for (n, sink) in self.alerting.sinks.iter().enumerate() {
            self.alert_sink(n, sink.as_ref(), &alert).await;
        }
    }

    /// The reminder a record open this long is due, if any: the n-th once it has been open n
    /// periods of `remind_after`, up to [`MAX_REMINDERS`].
    fn reminder_due(&self, record: &FailureRecord) -> Option<u32> {
        let every = self.config.remind_after?.as_millis().max(1);
        let open_for = (Utc::now() - record.last_failed_at).num_milliseconds().max(0) as u128;
        u32::try_from(open_for / every).ok().filter(|n| (1..=MAX_REMINDERS).contains(n))
    }

    async fn alert_sink(&self, n: usize, sink: &dyn AlertSink, alert: &Alert) {
        let record = &alert.record.id;
        let Some(key) = alert_key(&alert.record.id, n, alert.reminder) else {
            return error!(%record, "cannot make the alert's ledger key; alert not sent");
        };
        let payload = json!({ "record": record, "sink": n });
        let hold = match self.ledger.begin(&key, &payload, ProviderKey::mint(), ALERT_HOLD).await {
            Ok(Begin::Fresh(hold) | Begin::Resumed(hold)) => hold,
            Ok(Begin::Busy(_) | Begin::Done(_)) => return debug!(%record, "alert sent or being sent elsewhere"),
            Ok(Begin::Cancelled(_)) => return debug!(%record, "alert cancelled by a person"),
            Err(e) => return warn!(%record, error = %e, "effect ledger unavailable; the sweep sends this alert later"),
        };
        let backoff = Backoff { base: Duration::from_millis(200), max: Duration::from_secs(5), ..Backoff::default() };
        for attempt in 1..=ALERT_TRIES {
            match sink.send(alert).await {
                Ok(()) => {
                    self.counters.add_for(Count::Alerted, &alert.record.kind, 1);
                    metrics::counter!("redrive_alerts_total", "result" => "sent").increment(1);
                    // Which sink it reached: `redrive doctor` warns of alerts that only reached the log.
                    if let Err(e) = self.ledger.finish(&hold, &json!({ "sink": sink.name() })).await {
                        // It was sent; a sweep may send it once more.
                        warn!(%record, error = %e, "alert sent but not marked sent");
                    }
                    return;
                }
                Err(e) if attempt < ALERT_TRIES => {
                    warn!(%record, error = %e, attempt, "alert not delivered; trying again");
                    tokio::time::sleep(backoff.delay(attempt)).await;
                }
                Err(e) => {
                    metrics::counter!("redrive_alerts_total", "result" => "failed").increment(1);
                    error!(%record, error = %e, "alert not delivered; the next sweep tries again");
                }
            }
        }
        if let Err(e) = self.ledger.release_hold(&hold).await {
            debug!(error = %e, "could not release the alert's hold; it lapses on its own");
        }
    }

    /// Alerts every open record not alerted yet, until `stop`. A listing is never cut short: on
    /// SQS a listing receives the records for a moment, and one dropped half-way would leave
    /// them hidden from every reader for the receive's visibility.
    async fn sweep_once(&self, stop: &CancellationToken) {
        // The count is cheap everywhere (on SQS a queue attribute); the listing may not be.
        let open = self.queue.count_open().await;
        if let Ok(n) = open {
            metrics::gauge!("redrive_open_records").set(n as f64);
        }
        if open.is_ok_and(|n| n == 0) {
            return;
        }
        let mut query = FailureQuery::open();
        loop {
            let page = match self.queue.list(&query).await {
                Ok(page) => page,
                Err(e) => return warn!(error = %e, "alert sweep could not list failure records"),
            };
            let full = page.len() == query.page_size();
            query.after = page.last().map(|r| r.id.clone());
            for record in page {
                if stop.is_cancelled() {
                    return;
                }
                let reminder = self.reminder_due(&record);
                self.alert(record.clone()).await;
                if let Some(n) = reminder {
                    self.announce(record, n).await;
                }
            }
            if !full {
                return;
            }
        }
    }
}

/// How often the sweep looks, and how many times, after a job was handed to a service that
/// writes its record later (QStash lists it once it has taken the answer).
const HANDED_OFF_SWEEP: Duration = Duration::from_secs(1);
const HANDED_OFF_LOOKS: u32 = 4;

/// Sweeps at start, then every `alert_sweep` (and every second for a few seconds after a job
/// was handed to a service's dead-letter queue), until the worker stops.
pub(super) async fn sweep<Q: Claim + DeadLetter, L: Ledger>(shared: Arc<Shared<Q, L>>, stop: CancellationToken) {
    shared.sweep_once(&stop).await;
    let mut looks_left: u32 = 0;
    loop {
        let wait =
            if looks_left > 0 { HANDED_OFF_SWEEP.min(shared.config.alert_sweep) } else { shared.config.alert_sweep };
        tokio::select! {
            () = tokio::time::sleep(wait) => looks_left = looks_left.saturating_sub(1),
            // The service has only just been answered: look after a second, not at once.
            () = shared.alerting.handed_off.notified() => {
                looks_left = HANDED_OFF_LOOKS;
                continue;
            }
            () = stop.cancelled() => return,
        }
        shared.sweep_once(&stop).await;
    }
}
