//! Wrappers of a backend as one worker sees it: [`Frozen`], which stalls, breaks or kills that
//! worker's view, and the macros a wrapper forwards its untouched calls with.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use redrive_core::kit::{Backend, Begin, Capabilities, Claim, Claimed, Hold, Kinds, Lease, Ledger, Renew};
use redrive_core::{
    DeadLetter, Enqueue, Enqueued, Error, FailureId, FailureQuery, FailureRecord, IdempotencyKey, NewJob, ProviderKey,
};

/// What a [`Frozen`] backend does to one worker's calls: flags, set and cleared by the scenario.
#[derive(Default)]
pub(crate) struct Freeze(AtomicU8);

impl Freeze {
    /// Claims started from now on never return; everything else works.
    const CLAIMS: u8 = 1;
    /// Renewals (lease renewals and ledger hold extensions) hang.
    const RENEWALS: u8 = 2;
    /// Every call hangs, as when the process is killed.
    const ALL: u8 = 4;
    /// The effect ledger refuses connections.
    const LEDGER_DOWN: u8 = 8;
    /// Every call hangs from the moment a failure record is written, before its alert.
    const DIE_AFTER_RECORD: u8 = 16;

    fn set(&self, flag: u8) {
        self.0.fetch_or(flag, Ordering::SeqCst);
    }

    fn is(&self, flag: u8) -> bool {
        self.0.load(Ordering::SeqCst) & flag != 0
    }

    pub(crate) fn claims(&self) {
        self.set(Self::CLAIMS);
    }

    pub(crate) fn renewals(&self) {
        self.set(Self::RENEWALS);
    }

    pub(crate) fn all(&self) {
        self.set(Self::ALL);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.is(Self::ALL)
    }

    pub(crate) fn ledger_down(&self, down: bool) {
        if down {
            self.set(Self::LEDGER_DOWN);
        } else {
            self.0.fetch_and(!Self::LEDGER_DOWN, Ordering::SeqCst);
        }
    }

    pub(crate) fn die_after_record(&self) {
        self.set(Self::DIE_AFTER_RECORD);
    }

    async fn hang_if(&self, flags: u8) {
        if self.is(flags | Self::ALL) {
            std::future::pending::<()>().await;
        }
    }
}

/// A backend (queue and ledger) as one worker sees it, frozen on demand: with its claims frozen
/// the worker takes no more jobs but finishes and settles those it has; frozen whole, nothing it
/// holds is settled, extended or handed back, as when its process is killed. Calls already in
/// flight finish.
#[derive(Clone)]
pub(crate) struct Frozen<T> {
    inner: T,
    freeze: Arc<Freeze>,
}

impl<T> Frozen<T> {
    pub(crate) fn new(inner: T, freeze: &Arc<Freeze>) -> Self {
        Self { inner, freeze: Arc::clone(freeze) }
    }

    async fn alive(&self) {
        self.freeze.hang_if(0).await;
    }

    async fn ledger_up(&self) -> R<()> {
        self.alive().await;
        if self.freeze.is(Freeze::LEDGER_DOWN) {
            return Err(Error::temporary("the effect ledger refused the connection"));
        }
        Ok(())
    }
}

type R<T> = redrive_core::Result<T>;

impl<T: Backend> Backend for Frozen<T> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn messaging_system(&self) -> Option<&'static str> {
        self.inner.messaging_system()
    }

    fn messaging_destination(&self) -> Option<String> {
        self.inner.messaging_destination()
    }
}

impl<T: Enqueue> Enqueue for Frozen<T> {
    async fn enqueue(&self, job: NewJob) -> R<Enqueued> {
        self.alive().await;
        self.inner.enqueue(job).await
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> R<Vec<Enqueued>> {
        self.alive().await;
        self.inner.enqueue_batch(jobs).await
    }
}

impl<T: Claim> Claim for Frozen<T> {
    fn handles(&self, kinds: &Kinds) {
        self.inner.handles(kinds);
    }
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> R<Vec<Claimed>> {
        self.freeze.hang_if(Freeze::CLAIMS).await;
        self.inner.claim(kinds, max, lease, wait).await
    }
    async fn complete(&self, lease: &Lease, result: Option<&serde_json::Value>) -> R<()> {
        self.alive().await;
        self.inner.complete(lease, result).await
    }
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> R<()> {
        self.alive().await;
        self.inner.retry(lease, delay, error).await
    }
    async fn defer(&self, lease: &Lease, delay: Duration) -> R<()> {
        self.alive().await;
        self.inner.defer(lease, delay).await
    }
    async fn release(&self, lease: &Lease) -> R<()> {
        self.alive().await;
        self.inner.release(lease).await
    }
    async fn dead_letter(&self, job: &Claimed, error: &str) -> R<Option<FailureRecord>> {
        self.alive().await;
        let record = self.inner.dead_letter(job, error).await;
        if self.freeze.is(Freeze::DIE_AFTER_RECORD) {
            self.freeze.all();
        }
        record
    }
    async fn confirm_replay(&self, record: &FailureId) -> R<()> {
        self.alive().await;
        self.inner.confirm_replay(record).await
    }
    async fn withdraw_replay(&self, record: &FailureId, cancel: &redrive_core::Cancellation) -> R<()> {
        self.alive().await;
        self.inner.withdraw_replay(record, cancel).await
    }
    fn renewal(&self) -> Option<&impl Renew> {
        self.inner.renewal().map(|_| self)
    }
}

impl<T: Claim> Renew for Frozen<T> {
    async fn renew(&self, lease: &Lease, by: Duration) -> R<Lease> {
        self.freeze.hang_if(Freeze::RENEWALS).await;
        let renewal = self.inner.renewal().expect("offered only where the inner backend renews");
        renewal.renew(lease, by).await
    }
    async fn renew_settling(&self, lease: &Lease, by: Duration) -> R<Lease> {
        self.freeze.hang_if(Freeze::RENEWALS).await;
        let renewal = self.inner.renewal().expect("offered only where the inner backend renews");
        renewal.renew_settling(lease, by).await
    }
}

impl<T: DeadLetter> DeadLetter for Frozen<T> {
    async fn list(&self, query: &FailureQuery) -> R<Vec<FailureRecord>> {
        self.alive().await;
        self.inner.list(query).await
    }
    async fn get(&self, id: &FailureId) -> R<FailureRecord> {
        self.alive().await;
        self.inner.get(id).await
    }
    async fn count_open(&self) -> R<u64> {
        self.alive().await;
        self.inner.count_open().await
    }
    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> R<()> {
        self.alive().await;
        self.inner.discard(id, reason, actor).await
    }
    async fn purge(&self, age: Duration) -> R<u64> {
        self.alive().await;
        self.inner.purge(age).await
    }
    async fn blocked(&self) -> R<Vec<redrive_core::Blocked>> {
        self.alive().await;
        self.inner.blocked().await
    }
}

impl<T: Ledger> Ledger for Frozen<T> {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &serde_json::Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> R<Begin> {
        self.ledger_up().await?;
        self.inner.begin(key, payload, provider_key, hold).await
    }
    async fn extend_hold(&self, hold: &Hold, by: Duration) -> R<()> {
        self.freeze.hang_if(Freeze::RENEWALS).await;
        self.ledger_up().await?;
        self.inner.extend_hold(hold, by).await
    }
    async fn release_hold(&self, hold: &Hold) -> R<()> {
        self.ledger_up().await?;
        self.inner.release_hold(hold).await
    }
    async fn finish(&self, hold: &Hold, result: &serde_json::Value) -> R<()> {
        self.ledger_up().await?;
        self.inner.finish(hold, result).await
    }
    async fn cancel_effect(
        &self,
        key: &redrive_core::IdempotencyKey,
        reason: &str,
        actor: &str,
    ) -> R<redrive_core::CancelOutcome> {
        self.ledger_up().await?;
        self.inner.cancel_effect(key, reason, actor).await
    }
    fn flow(&self) -> Option<&impl redrive_core::Flow> {
        self.inner.flow()
    }
}

/// In a wrapper's `impl Claim`: `retry`, `defer`, `release` and `dead_letter` passed to its
/// `inner` unchanged, and `renewal` offered wherever the inner queue renews (the wrapper's own
/// `impl Renew` then does the renewing).
macro_rules! forward_settlements {
    () => {
        async fn retry(
            &self,
            lease: &redrive_core::kit::Lease,
            delay: std::time::Duration,
            error: &str,
        ) -> redrive_core::Result<()> {
            self.inner.retry(lease, delay, error).await
        }
        async fn defer(
            &self,
            lease: &redrive_core::kit::Lease,
            delay: std::time::Duration,
        ) -> redrive_core::Result<()> {
            self.inner.defer(lease, delay).await
        }
        async fn release(&self, lease: &redrive_core::kit::Lease) -> redrive_core::Result<()> {
            self.inner.release(lease).await
        }
        async fn dead_letter(
            &self,
            job: &redrive_core::kit::Claimed,
            error: &str,
        ) -> redrive_core::Result<Option<redrive_core::FailureRecord>> {
            self.inner.dead_letter(job, error).await
        }
        async fn confirm_replay(&self, record: &redrive_core::FailureId) -> redrive_core::Result<()> {
            self.inner.confirm_replay(record).await
        }
        async fn withdraw_replay(
            &self,
            record: &redrive_core::FailureId,
            cancel: &redrive_core::Cancellation,
        ) -> redrive_core::Result<()> {
            self.inner.withdraw_replay(record, cancel).await
        }
        fn renewal(&self) -> Option<&impl redrive_core::kit::Renew> {
            self.inner.renewal().map(|_| self)
        }
    };
}
pub(crate) use forward_settlements;

/// `Backend` and `DeadLetter` for the wrapper `$wrapper<T>`, passed to its `inner` unchanged.
macro_rules! forward_capabilities_and_records {
    ($wrapper:ident) => {
        impl<T: redrive_core::kit::Backend> redrive_core::kit::Backend for $wrapper<T> {
            fn capabilities(&self) -> redrive_core::kit::Capabilities {
                self.inner.capabilities()
            }

            fn messaging_system(&self) -> Option<&'static str> {
                self.inner.messaging_system()
            }

            fn messaging_destination(&self) -> Option<String> {
                self.inner.messaging_destination()
            }
        }

        impl<T: redrive_core::DeadLetter> redrive_core::DeadLetter for $wrapper<T> {
            async fn list(
                &self,
                query: &redrive_core::FailureQuery,
            ) -> redrive_core::Result<Vec<redrive_core::FailureRecord>> {
                self.inner.list(query).await
            }
            async fn get(&self, id: &redrive_core::FailureId) -> redrive_core::Result<redrive_core::FailureRecord> {
                self.inner.get(id).await
            }
            async fn count_open(&self) -> redrive_core::Result<u64> {
                self.inner.count_open().await
            }
            async fn discard(
                &self,
                id: &redrive_core::FailureId,
                reason: &str,
                actor: &str,
            ) -> redrive_core::Result<()> {
                self.inner.discard(id, reason, actor).await
            }
            async fn purge(&self, age: std::time::Duration) -> redrive_core::Result<u64> {
                self.inner.purge(age).await
            }
            async fn blocked(&self) -> redrive_core::Result<Vec<redrive_core::Blocked>> {
                self.inner.blocked().await
            }
        }
    };
}
pub(crate) use forward_capabilities_and_records;
