//! The key's hold while an attempt runs: taken before the handler, kept alive beside it, ended
//! after it.
//!
//! The hold is one mechanism on every backend: an attempt whose handler runs holds its key, and
//! keeps holding it whatever the heartbeat setting. How it is kept differs by [`HoldMode`], and
//! each mode has its own path: the job's lease renewed, or a ledger hold extended beside the
//! lease. If no renewal gets through before the hold would lapse, the handler is cancelled first:
//! two attempts of one key never run at once.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Shared;
use super::admission::KeyState;
use super::attempt::Attempt;
use crate::backend::{Begin, Claim, DeadLetter, Hold, Ledger, Renew};
use crate::error::{ErrorKind, Result};

/// How the key's hold is kept: the one thing that differs between a store whose job row is its
/// key's ledger entry and every other backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldMode {
    /// The hold is the job's lease ([`Claimed::begun`](crate::kit::Claimed::begun): Postgres,
    /// SQLite): the claim took the key, renewing the lease keeps it, settling the job ends it, and
    /// the job's completion with its result marks the effect done, in one fenced write.
    Lease,
    /// A hold in the effect ledger, apart from the lease: extended and released in the ledger,
    /// where the effect is marked done before the job completes.
    Ledger,
}

impl HoldMode {
    /// The mode of a hold as the ledger (or the claim) gave it.
    fn of(hold: &Hold) -> Self {
        if hold.lease.is_some() { Self::Lease } else { Self::Ledger }
    }
}

/// The key's hold, and how it is kept.
pub(super) struct Held {
    pub(super) hold: Hold,
    pub(super) mode: HoldMode,
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// Takes the key's hold: as the claim carried it, or from the ledger. Keeps the hold in
    /// `held` if one was taken, and returns what admission needs to know of the answer.
    pub(super) async fn take_hold(
        &self,
        attempt: &Attempt<'_>,
        claimed_at: Instant,
        held: &mut Option<Held>,
    ) -> KeyState {
        let job = &attempt.claimed.job;
        // The hold starts when the ledger takes it: no later than now.
        let asked = Instant::now();
        let begin = match &attempt.claimed.begun {
            Some(begun) => Ok(begun.clone()),
            None => self.ledger.begin(&job.key, &job.payload, job.provider_key, self.config.lease).await,
        };
        let (hold, state) = match begin {
            Ok(Begin::Fresh(hold)) => (hold, KeyState::Fresh),
            Ok(Begin::Resumed(hold)) => (hold, KeyState::Resumed),
            Ok(Begin::Busy(held_for)) => return KeyState::Busy(held_for),
            Ok(Begin::Done(_)) => return KeyState::Done,
            Ok(Begin::Cancelled(cancel)) => return KeyState::Cancelled(cancel),
            Err(e) if e.kind() == ErrorKind::KeyConflict => return KeyState::Conflict(e.to_string()),
            Err(e) => return KeyState::Unreachable { failures: self.claiming.ledger_failed(), error: e.to_string() },
        };
        self.claiming.ledger_ok();
        let mode = HoldMode::of(&hold);
        attempt.hold_until(match mode {
            // Held since the claim, for the claim lease, until the job moves to its full lease.
            HoldMode::Lease => claimed_at + self.claim_lease,
            HoldMode::Ledger => asked + self.config.lease,
        });
        *held = Some(Held { hold, mode });
        state
    }

    /// Ends the key's hold of an attempt that did not finish the effect.
    pub(super) async fn release_hold(&self, held: &Held) {
        match held.mode {
            // It ends when the job is settled.
            HoldMode::Lease => {}
            HoldMode::Ledger => {
                if let Err(e) = self.ledger.release_hold(&held.hold).await {
                    debug!(error = %e, "could not release the key's hold; it lapses on its own");
                }
            }
        }
    }

    /// Moves the job to its full lease before the handler runs, which marks it started.
    /// `Err(Stop::Cancelled)`: a person cancelled the job since its claim, and the handler must
    /// not start.
    pub(super) async fn mark_started(&self, attempt: &Attempt<'_>, held: &Held) -> Result<(), Stop> {
        let Some(renewal) = self.queue.renewal() else { return Ok(()) };
        let asked = Instant::now();
        match renewal.renew(&attempt.lease(), self.config.lease).await {
            Ok(lease) => {
                attempt.renewed(lease);
                if held.mode == HoldMode::Lease {
                    attempt.hold_until(asked + self.config.lease);
                }
            }
            Err(e) if e.kind() == ErrorKind::Cancelled => {
                info!("the job was cancelled before its handler started: it does not run");
                return Err(Stop::Cancelled);
            }
            Err(e) => warn!(error = %e, "could not mark the job started"),
        }
        Ok(())
    }

    /// For as long as a handler runs (polled beside it, so it never holds the handler up): moves
    /// its job from the claim lease to the full lease, then keeps the key's hold alive. Returns
    /// only when the handler must stop: the hold is about to lapse without a renewal having got
    /// through (or was taken over), or a person cancelled the job.
    pub(super) async fn keep_alive(&self, attempt: &Attempt<'_>, held: &Held) -> Stop {
        match held.mode {
            HoldMode::Lease => self.keep_lease_hold(attempt).await,
            HoldMode::Ledger => self.keep_ledger_hold(attempt, &held.hold).await,
        }
    }

    /// The hold is the job's lease: renewing the lease keeps both, at every beat, heartbeat or
    /// not. A hung handler thus holds its job for as long as its process lives.
    async fn keep_lease_hold(&self, attempt: &Attempt<'_>) -> Stop {
        let Some(renewal) = self.queue.renewal() else {
            // Nothing renews it: the hold lasts the lease the job was claimed with.
            tokio::time::sleep_until(attempt.stop_by()).await;
            return Stop::Lapsing;
        };
        // Until it moves, the claim lease is the hold: one that cannot move lapses with it.
        let asked = match self.to_full_lease(attempt, renewal).await {
            Ok(asked) => asked,
            Err(stop) => return stop,
        };
        attempt.hold_until(asked + self.config.lease);
        let mut beat = Instant::now() + self.beat_every();
        while self.next_beat(attempt, &mut beat).await {
            let asked = Instant::now();
            let renewed =
                async { renewal.renew(&attempt.lease(), self.config.lease).await.map(|l| attempt.renewed(l)) };
            if let Some(stop) = self.extended(attempt, asked, renewed).await {
                return stop;
            }
        }
        Stop::Lapsing
    }

    /// A hold in the ledger: extended there at every beat, for as long as the handler runs,
    /// heartbeat or not: it says "an attempt is alive", so a redelivery meanwhile waits instead of
    /// repeating the effect. The lease is moved to the full lease (which marks the job started),
    /// then extended only with the heartbeat on.
    async fn keep_ledger_hold(&self, attempt: &Attempt<'_>, hold: &Hold) -> Stop {
        let renewal = self.queue.renewal();
        if let Some(renewal) = renewal {
            // The hold does not depend on the move: it goes on whether the move got through,
            // unless the job was cancelled.
            if let Err(Stop::Cancelled) = self.to_full_lease(attempt, renewal).await {
                return Stop::Cancelled;
            }
        }
        let heartbeat = renewal.filter(|_| self.config.heartbeat.is_some());
        let every = self.beat_every();
        let mut beat = Instant::now() + every;
        while self.next_beat(attempt, &mut beat).await {
            let asked = Instant::now();
            if let Some(stop) = self.extended(attempt, asked, self.ledger.extend_hold(hold, self.config.lease)).await {
                return stop;
            }
            if let Some(renewal) = heartbeat {
                match tokio::time::timeout(every, renewal.renew(&attempt.lease(), self.config.lease)).await {
                    Ok(Ok(lease)) => attempt.renewed(lease),
                    Ok(Err(e)) if e.kind() == ErrorKind::Cancelled => return cancelled(),
                    Ok(Err(e)) => warn!(error = %e, "heartbeat failed; another worker may take this job"),
                    Err(_) => warn!("heartbeat timed out; another worker may take this job"),
                }
            }
        }
        Stop::Lapsing
    }

    /// How often the hold is kept alive: the heartbeat, or a third of the lease with it off.
    fn beat_every(&self) -> Duration {
        self.config.heartbeat.unwrap_or(self.config.lease / 3).max(Duration::from_millis(10))
    }

    /// Moves the job from its claim lease to the full lease (which marks it started), trying
    /// again until the hold is about to lapse. Returns when the renewal that got through was
    /// asked for; why the handler must stop if none did (the claim lease had lapsed, or a
    /// person cancelled the job).
    async fn to_full_lease(&self, attempt: &Attempt<'_>, renewal: &impl Renew) -> std::result::Result<Instant, Stop> {
        loop {
            let asked = Instant::now();
            match tokio::time::timeout_at(attempt.stop_by(), renewal.renew(&attempt.lease(), self.config.lease)).await {
                Ok(Ok(lease)) => {
                    attempt.renewed(lease);
                    return Ok(asked);
                }
                Ok(Err(e)) if e.kind() == ErrorKind::Cancelled => return Err(cancelled()),
                Ok(Err(e)) if e.kind() == ErrorKind::LeaseLost => {
                    warn!("the job's claim lease lapsed before its handler started; another worker may run it");
                    return Err(Stop::Lapsing);
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "could not move the job to its full lease; trying again");
                    let left = attempt.stop_by().saturating_duration_since(Instant::now());
                    tokio::time::sleep((self.claim_lease / 4).min(left)).await;
                }
                Err(_) => return Err(Stop::Lapsing),
            }
            if Instant::now() >= attempt.stop_by() {
                return Err(Stop::Lapsing);
            }
        }
    }

    /// Waits for the next beat: `false` if the hold is about to lapse first.
    async fn next_beat(&self, attempt: &Attempt<'_>, beat: &mut Instant) -> bool {
        tokio::select! {
            () = tokio::time::sleep_until(*beat) => {}
            () = tokio::time::sleep_until(attempt.stop_by()) => return false,
        }
        *beat += self.beat_every();
        true
    }

    /// Waits for an extension of the hold asked for at `asked`, until the hold is about to lapse:
    /// why the handler must stop, or `None` if it may go on.
    async fn extended(
        &self,
        attempt: &Attempt<'_>,
        asked: Instant,
        extension: impl Future<Output = Result<()>>,
    ) -> Option<Stop> {
        match tokio::time::timeout_at(attempt.stop_by(), extension).await {
            Ok(Ok(())) => {
                attempt.hold_until(asked + self.config.lease);
                None
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Cancelled => Some(cancelled()),
            Ok(Err(e)) if e.kind() == ErrorKind::LeaseLost => {
                warn!("another attempt took over the key's hold");
                Some(Stop::Lapsing)
            }
            Ok(Err(e)) => {
                warn!(error = %e, "could not extend the key's hold; trying again at the next beat");
                None
            }
            Err(_) => Some(Stop::Lapsing),
        }
    }
}

/// Why a running handler must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Its key's hold is about to lapse (or was taken over).
    Lapsing,
    /// A person cancelled the job: its lease renewal was refused.
    Cancelled,
}

fn cancelled() -> Stop {
    info!("the job was cancelled while it ran: its handler is stopped");
    Stop::Cancelled
}
