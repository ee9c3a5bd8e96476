//! What a worker keeps of flow control's shared state between jobs, so that a limit that does not
//! bind costs the store next to nothing: the concurrency slots it holds (a slot serves job after
//! job of its key while they keep coming, and goes back to the store once idle for a moment), and
//! rate tokens taken a few at a time and spent at once, or not at all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Rate, Slot};

/// Tokens asked for at once at most.
const TOKENS_MOST: u32 = 4096;

/// How long tokens taken ahead stay spendable. A start comes at most this long after its token
/// was granted, so a bucket's bound is exceeded, in any window, by at most this much of its rate;
/// tokens not spent by then are dropped (the rate undershoots, never overshoots).
pub(super) const TOKENS_KEPT: Duration = Duration::from_millis(20);

/// The slots and tokens a worker holds.
pub(super) struct Permits {
    slots: Mutex<HashMap<String, Vec<Held>>>,
    tokens: Mutex<HashMap<String, Spare>>,
    /// How long a slot stays idle here before it goes back to the store.
    linger: Duration,
    /// How often a held slot is renewed in the store.
    renew_every: Duration,
    /// When the held slots were last looked over.
    swept: Mutex<Instant>,
}

struct Held {
    slot: Slot,
    /// Since when it is idle; `None` while a job holds it.
    idle_since: Option<Instant>,
    renewed: Instant,
}

struct Spare {
    left: u32,
    until: Instant,
}

/// What a sweep found: slots idle long enough to go back, and slots due a renewal.
#[derive(Default)]
pub(super) struct Sweep {
    pub(super) release: Vec<Slot>,
    pub(super) renew: Vec<Slot>,
}

impl Permits {
    pub(super) fn new(linger: Duration, renew_every: Duration) -> Self {
        Self {
            slots: Mutex::default(),
            tokens: Mutex::default(),
            linger,
            renew_every,
            swept: Mutex::new(Instant::now()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Held>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle slot of `key` this worker holds, one of the first `limit` (a lowered limit leaves
    /// the others idle, to go back), now lent to a job. A slot idle past the linger or due a
    /// renewal is not lent: a sweep may be late, and the store may have let it lapse.
    pub(super) fn lend(&self, key: &str, limit: u32) -> Option<Slot> {
        let now = Instant::now();
        let mut held = self.held();
        let fresh = |h: &Held| {
            h.slot.slot < limit
                && h.idle_since.is_some_and(|since| now.duration_since(since) < self.linger)
                && now.duration_since(h.renewed) < self.renew_every
        };
        let idle = held.get_mut(key)?.iter_mut().find(|h| fresh(h))?;
        idle.idle_since = None;
        Some(idle.slot.clone())
    }

    /// A slot just taken from the store for a job.
    pub(super) fn adopt(&self, slot: Slot) {
        let held = Held { slot, idle_since: None, renewed: Instant::now() };
        self.held().entry(held.slot.key.clone()).or_default().push(held);
    }

    /// How often the held slots want a sweep: half the linger or half the renewal period.
    pub(super) fn sweep_every(&self) -> Duration {
        self.linger.min(self.renew_every) / 2
    }

    /// A job is done with `slot`: it stays here, idle, for the next job of its key.
    pub(super) fn give_back(&self, slot: &Slot) {
        let mut held = self.held();
        if let Some(h) = held.get_mut(&slot.key).and_then(|s| s.iter_mut().find(|h| h.slot == *slot)) {
            h.idle_since = Some(Instant::now());
        }
    }

    /// Forgets `slot`: it lapsed and was taken over, or went back to the store.
    pub(super) fn forget(&self, slot: &Slot) {
        let mut held = self.held();
        if let Some(slots) = held.get_mut(&slot.key) {
            slots.retain(|h| h.slot != *slot);
            if slots.is_empty() {
                held.remove(&slot.key);
            }
        }
    }

    /// The slots idle past the linger (forgotten here: the caller gives them back to the store)
    /// and those due a renewal (marked renewed), at most once per half linger (or half renewal
    /// period, if shorter); `all` takes
    /// every idle slot, at once (the worker is stopping).
    pub(super) fn sweep(&self, all: bool) -> Sweep {
        let now = Instant::now();
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if !all && now.duration_since(*swept) < self.sweep_every() {
                return Sweep::default();
            }
            *swept = now;
        }
        let mut sweep = Sweep::default();
        let mut held = self.held();
        for slots in held.values_mut() {
            slots.retain_mut(|h| {
                if h.idle_since.is_some_and(|since| all || now.duration_since(since) >= self.linger) {
                    sweep.release.push(h.slot.clone());
                    return false;
                }
                if now.duration_since(h.renewed) >= self.renew_every {
                    h.renewed = now;
                    sweep.renew.push(h.slot.clone());
                }
                true
            });
        }
        held.retain(|_, slots| !slots.is_empty());
        drop(held);
        // Tokens past their time are worth nothing: forget their keys (one per tenant, else).
        self.tokens.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, spare| now < spare.until);
        sweep
    }

    /// Spends a token of `key` taken ahead, if one is left.
    pub(super) fn spend(&self, key: &str) -> bool {
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        match tokens.get_mut(key) {
            Some(spare) if spare.left > 0 && Instant::now() < spare.until => {
                spare.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// How many tokens to ask for at once at `rate`: what it allows in [`TOKENS_KEPT`] (at least
    /// one, at most [`TOKENS_MOST`]), so a rate that does not bind costs one round trip per
    /// thousands of starts, and one that binds hands out no more than can be spent in time.
    pub(super) fn want(rate: Rate) -> u32 {
        let per_kept = u128::from(rate.count) * TOKENS_KEPT.as_micros() / rate.per.as_micros().max(1);
        per_kept.clamp(1, u128::from(TOKENS_MOST)) as u32
    }

    /// Keeps `left` tokens of `key` taken just now, for [`TOKENS_KEPT`].
    pub(super) fn stock(&self, key: &str, left: u32) {
        let spare = Spare { left, until: Instant::now() + TOKENS_KEPT };
        self.tokens.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), spare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &str, n: u32) -> Slot {
        Slot { key: key.into(), slot: n, token: format!("t{n}") }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_serves_the_next_job_of_its_key_then_goes_back_once_idle() {
        let permits = Permits::new(Duration::from_millis(100), Duration::from_secs(10));
        assert_eq!(permits.lend("kind:a", 10), None, "nothing held yet: take one from the store");
        permits.adopt(slot("kind:a", 0));
        assert_eq!(permits.lend("kind:a", 10), None, "the one held is busy");
        permits.give_back(&slot("kind:a", 0));
        assert_eq!(
            permits.lend("kind:a", 10),
            Some(slot("kind:a", 0)),
            "the next job of the key takes it, no round trip"
        );
        assert_eq!(permits.lend("kind:b", 10), None, "another key's jobs do not");
        permits.give_back(&slot("kind:a", 0));
        tokio::time::advance(Duration::from_millis(60)).await;
        assert!(permits.sweep(false).release.is_empty(), "idle for less than the linger: kept");
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(permits.sweep(false).release, [slot("kind:a", 0)], "idle past the linger: back to the store");
        assert_eq!(permits.lend("kind:a", 10), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_past_a_lowered_limit_or_due_a_renewal_is_not_lent() {
        let permits = Permits::new(Duration::from_millis(100), Duration::from_secs(10));
        permits.adopt(slot("kind:a", 4));
        permits.give_back(&slot("kind:a", 4));
        assert_eq!(permits.lend("kind:a", 4), None, "slot 4 is past a limit lowered to 4");
        assert_eq!(permits.lend("kind:a", 5), Some(slot("kind:a", 4)));
        permits.give_back(&slot("kind:a", 4));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(permits.lend("kind:a", 5), None, "idle past the linger: its sweep may be late");
    }

    #[tokio::test(start_paused = true)]
    async fn held_slots_are_renewed_busy_or_idle_and_all_idle_ones_go_at_a_stop() {
        let permits = Permits::new(Duration::from_secs(60), Duration::from_secs(10));
        permits.adopt(slot("kind:a", 0));
        permits.adopt(slot("kind:a", 1));
        permits.give_back(&slot("kind:a", 1));
        tokio::time::advance(Duration::from_secs(11)).await;
        let sweep = permits.sweep(false);
        assert_eq!((sweep.release.len(), sweep.renew.len()), (0, 2));
        assert!(permits.sweep(true).release == [slot("kind:a", 1)], "stopping: the idle one goes back");
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_taken_ahead_are_spent_at_once_or_dropped() {
        let permits = Permits::new(Duration::from_millis(100), Duration::from_secs(10));
        assert!(!permits.spend("kind:a"));
        permits.stock("kind:a", 2);
        assert!(permits.spend("kind:a") && permits.spend("kind:a") && !permits.spend("kind:a"));
        permits.stock("kind:a", 5);
        tokio::time::advance(TOKENS_KEPT).await;
        assert!(!permits.spend("kind:a"), "kept past their time, they would make a burst the rate does not allow");
    }

    #[test]
    fn a_take_asks_for_what_the_rate_allows_while_tokens_are_kept() {
        assert_eq!(Permits::want(Rate::per_second(100)), 2);
        assert_eq!(Permits::want(Rate::per_second(5)), 1, "at least one");
        assert_eq!(Permits::want(Rate::per_second(10_000)), 200);
        assert_eq!(Permits::want(Rate::per_second(10_000_000)), 4096, "at most TOKENS_MOST");
    }
}
