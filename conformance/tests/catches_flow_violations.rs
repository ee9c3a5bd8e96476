//! The flow-control scenarios fail on a broken flow store: the in-memory backend as queue, with
//! its effect ledger offering a store that forgets a pause, hands out a slot or a token it does
//! not have, or no store at all.

use std::time::Duration;

use redrive_conformance::{Subject, Timing};
use redrive_core::kit::{Begin, Hold, Ledger, Slot, Tokens};
use redrive_core::{Flow, FlowEvent, IdempotencyKey, KindFlow, Limits, MemoryBackend, ProviderKey, Rate, Result};
use serde_json::Value;

/// The memory backend's ledger, its flow store broken by one fault (`None`: no store at all).
#[derive(Clone)]
struct BrokenFlow(MemoryBackend, Option<Fault>);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// A pause is answered as made and not kept, as a store writing to a table nobody reads.
    ForgetsPauses,
    /// Every slot is free: the limit is counted per caller, not in the store.
    SlotsUnlimited,
    /// Slots per key are free: a limit key is ignored.
    KeySlotsUnlimited,
    /// Every token is granted: the bucket is never spent.
    TokensUnlimited,
}

impl Ledger for BrokenFlow {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        self.0.begin(key, payload, provider_key, hold).await
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        self.0.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        self.0.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        self.0.finish(hold, result).await
    }
    fn flow(&self) -> Option<&impl Flow> {
        self.1.map(|_| self)
    }
}

impl Flow for BrokenFlow {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        self.0.kinds().await
    }
    async fn pause(&self, kind: &str, reason: &str, by: &str, probe_after: Option<Duration>) -> Result<bool> {
        if self.1 == Some(Fault::ForgetsPauses) {
            return Ok(true);
        }
        self.0.pause(kind, reason, by, probe_after).await
    }
    async fn resume(&self, kind: &str, by: &str) -> Result<bool> {
        self.0.resume(kind, by).await
    }
    async fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> Result<()> {
        self.0.set_limits(kind, limits, by).await
    }
    async fn events(&self, kind: Option<&str>, limit: usize) -> Result<Vec<FlowEvent>> {
        self.0.events(kind, limit).await
    }
    async fn take_probe(&self, kind: &str, cool_down: Duration) -> Result<bool> {
        self.0.take_probe(kind, cool_down).await
    }
    async fn close_breaker(&self, kind: &str) -> Result<bool> {
        self.0.close_breaker(kind).await
    }
    async fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> Result<Tokens> {
        if self.1 == Some(Fault::TokensUnlimited) {
            return Ok(Tokens { granted: want, wait: Duration::ZERO });
        }
        self.0.take_tokens(key, rate, want).await
    }
    async fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> Result<Option<Slot>> {
        let unlimited = match self.1 {
            Some(Fault::SlotsUnlimited) => true,
            Some(Fault::KeySlotsUnlimited) => key.starts_with("key:"),
            _ => false,
        };
        if unlimited {
            return Ok(Some(Slot { key: key.to_owned(), slot: 0, token: "any".to_owned() }));
        }
        self.0.take_slot(key, limit, lease).await
    }
    async fn renew_slot(&self, slot: &Slot, lease: Duration) -> Result<bool> {
        self.0.renew_slot(slot, lease).await
    }
    async fn release_slot(&self, slot: &Slot) -> Result<()> {
        self.0.release_slot(slot).await
    }
}

fn broken(fault: Option<Fault>) -> Subject<MemoryBackend, BrokenFlow> {
    let backend = MemoryBackend::new();
    let timing = Timing { timeout: Duration::from_secs(8), ..Timing::default() };
    Subject::new(backend.clone(), BrokenFlow(backend, fault), timing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_without_a_flow_store_fails_paused_kind() {
    let violation = redrive_conformance::paused_kind(broken(None)).await.unwrap_err();
    assert!(violation.message.contains("keeps no flow store"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_a_pause_fails_paused_kind() {
    let violation = redrive_conformance::paused_kind(broken(Some(Fault::ForgetsPauses))).await.unwrap_err();
    assert!(violation.message.contains("should answer false and keep the first pause"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_whose_pause_is_forgotten_fails_outage_storm() {
    let violation = redrive_conformance::outage_storm(broken(Some(Fault::ForgetsPauses))).await.unwrap_err();
    assert!(violation.message.contains("should trip the breaker"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_tokens_fail_rate_limited() {
    let violation = redrive_conformance::rate_limited(broken(Some(Fault::TokensUnlimited))).await.unwrap_err();
    assert!(violation.message.contains("the rate was not kept"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_slots_fail_kind_concurrency() {
    let violation = redrive_conformance::kind_concurrency(broken(Some(Fault::SlotsUnlimited))).await.unwrap_err();
    assert!(violation.message.contains("limited to 2 at once had"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_the_limit_key_fails_key_concurrency() {
    let violation = redrive_conformance::key_concurrency(broken(Some(Fault::KeySlotsUnlimited))).await.unwrap_err();
    assert!(violation.message.contains("limited to 1 at once, had"), "{violation}");
}
