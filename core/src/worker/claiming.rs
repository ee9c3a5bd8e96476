//! Claiming ahead of the handlers: the claimers, the pace that sizes their claims, the back-off
//! while the effect ledger is unreachable, and the dispatcher that hands claimed jobs to handlers.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, warn};

use super::{Count, Shared, WorkerConfig, job_span};
use crate::backend::{Claim, Claimed, DeadLetter, Kinds, Ledger};
use crate::policy::Backoff;

/// The part of the worker that claims: what it claims, how much ahead of its handlers, and when
/// it pauses.
pub(super) struct Claiming {
    /// The kinds this worker has handlers for: the only ones it claims.
    kinds: Kinds,
    pace: Pace,
    /// Backs off claims while the effect ledger is unreachable.
    infra: Infra,
    /// Claimed jobs waiting for a handler, and a signal each time one is taken or a handler
    /// finishes (either makes room for a claim).
    buffered: AtomicUsize,
    taken: Notify,
    /// A permit per handler running.
    slots: Arc<Semaphore>,
}

impl Claiming {
    pub(super) fn new(kinds: Kinds, concurrency: usize) -> Self {
        Self {
            kinds,
            pace: Pace::default(),
            infra: Infra::default(),
            buffered: AtomicUsize::new(0),
            taken: Notify::new(),
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    /// A handler finished, or a claimed job left the buffer: room for a claim.
    pub(super) fn room_made(&self) {
        self.taken.notify_waiters();
    }

    /// A handler took this long: the pace claims follow.
    pub(super) fn handler_took(&self, took: Duration) {
        self.pace.record(took);
    }

    /// The effect ledger could not be reached (again): how many times in a row.
    pub(super) fn ledger_failed(&self) -> u32 {
        self.infra.failed()
    }

    /// Pauses claims for `delay` (or until a later pause already set ends).
    pub(super) fn pause_for(&self, delay: Duration) {
        self.infra.pause_for(delay);
    }

    /// The effect ledger answered: the next outage backs off from the start.
    pub(super) fn ledger_ok(&self) {
        self.infra.ok();
    }
}

/// How much work a worker claims ahead of its handlers: about this long of it. Fast jobs are
/// claimed in full batches; slow ones a few at a time, so that several workers on one queue share
/// the work instead of one holding a batch it needs minutes to get through.
const CLAIM_AHEAD: Duration = Duration::from_secs(1);

/// How often a claimer paused for settlements being tried again looks whether they have landed.
const UNSETTLED_LOOK: Duration = Duration::from_millis(20);

/// A moving average of how long handlers take, in microseconds; 0 until one has finished.
#[derive(Debug, Default)]
struct Pace(AtomicU64);

impl Pace {
    fn record(&self, took: Duration) {
        let took = took.as_micros().clamp(1, u64::MAX as u128) as u64;
        // Weight 1/4 to the newest: it follows a change of workload within a few jobs.
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 { took } else { avg - avg / 4 + took / 4 })
        });
    }

    /// Jobs to hold claimed ahead of the handlers: as many as they get through in
    /// [`CLAIM_AHEAD`] (or a quarter of the claim lease, if shorter). None before any handler
    /// has finished: nothing says yet whether the jobs are quick, and a slow job claimed ahead
    /// would wait out its claim lease in the buffer.
    fn ahead(&self, config: &WorkerConfig, claim_lease: Duration) -> usize {
        let concurrency = config.concurrency.max(1) as u128;
        let avg = self.0.load(Ordering::Relaxed) as u128;
        // Never more than a quarter of the claim lease's worth, so that a claimed job starts well
        // before its claim lease is half gone (and it would be handed back).
        let work = CLAIM_AHEAD.min(claim_lease / 4).as_micros();
        let ahead = (concurrency * work).checked_div(avg).unwrap_or(0);
        ahead.min(usize::MAX as u128) as usize
    }
}

/// Failures of the effect ledger in a row, and until when claims pause because of them. An
/// unreachable ledger is not the job's fault: its jobs are deferred without spending an attempt
/// (for as long as admission says), and the worker stops taking more until the pause is over.
#[derive(Debug, Default)]
struct Infra {
    failures: AtomicU32,
    pause_until: Mutex<Option<Instant>>,
}

impl Infra {
    /// Counts a failure; returns the failures in a row.
    fn failed(&self) -> u32 {
        self.failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Pauses claims for `delay`, unless they are paused for longer already.
    fn pause_for(&self, delay: Duration) {
        let mut until = self.pause_until.lock().unwrap_or_else(|p| p.into_inner());
        let end = Instant::now() + delay;
        *until = Some(until.map_or(end, |u| u.max(end)));
    }

    fn ok(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    fn pause(&self) -> Option<Instant> {
        let until = *self.pause_until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|u| *u > Instant::now())
    }
}

/// The largest power of two not above `n` (1 for 0).
fn power_of_two_at_most(n: usize) -> usize {
    if n <= 1 { 1 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) }
}

/// A claim of `n` jobs as asked: a full `batch` as it is (SQS takes ten: a claim of eight would
/// cost a quarter more requests per job), anything less rounded down to a power of two.
fn claim_count(n: usize, batch: usize) -> usize {
    if n >= batch { batch } else { power_of_two_at_most(n) }
}

/// Claims ahead of the running handlers: `claimers` claim calls in flight, each taking up to
/// `batch` jobs, into a buffer the dispatcher hands to at most `concurrency` handlers. Beside
/// them, the alert sweep.
pub(super) async fn claim_loop<Q: Claim + DeadLetter + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    shared.queue.handles(&shared.claiming.kinds);
    let claimers = shared.config.claimers.max(1);
    let room = Arc::new(Semaphore::new(shared.batch() * claimers));
    let (buffer, waiting) = mpsc::unbounded_channel::<(Instant, Claimed)>();
    let dispatcher = tokio::spawn(dispatch(Arc::clone(&shared), waiting, Arc::clone(&room), stop.clone(), tracker));
    let sweep = tokio::spawn(super::alerts::sweep(Arc::clone(&shared), stop.clone()));
    let slots = {
        let (shared, stop) = (Arc::clone(&shared), stop.clone());
        tokio::spawn(async move { shared.keep_sweeping(&stop).await })
    };
    let claimers: Vec<_> = (0..claimers)
        .map(|_| tokio::spawn(claimer(Arc::clone(&shared), buffer.clone(), Arc::clone(&room), stop.clone())))
        .collect();
    drop(buffer);
    for claimer in claimers {
        if let Err(e) = claimer.await {
            error!(error = %e, "worker claimer panicked");
        }
    }
    if let Err(e) = dispatcher.await {
        error!(error = %e, "worker dispatcher panicked");
    }
    // No job will be dispatched again: the concurrency slots held idle go back to the store, and
    // those of running jobs as each settles.
    shared.stop_flow().await;
    if let Err(e) = sweep.await {
        error!(error = %e, "worker alert sweep panicked");
    }
    if let Err(e) = slots.await {
        error!(error = %e, "worker slot sweep panicked");
    }
}

/// One claim call at a time, for as many jobs as the handlers get through in about
/// [`CLAIM_AHEAD`] (at most `batch`), once the buffer has room for them.
async fn claimer<Q: Claim + DeadLetter + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    buffer: mpsc::UnboundedSender<(Instant, Claimed)>,
    room: Arc<Semaphore>,
    stop: CancellationToken,
) {
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        if let Some(until) = shared.claiming.infra.pause() {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = stop.cancelled() => break,
            }
        }
        // A settlement being tried again (the database was unreachable, or busy) lands before the
        // next claim, which could sweep its job's lapsed lease back to the queue and run it twice.
        while shared.attempts.unsettled() > 0 {
            tokio::select! {
                () = tokio::time::sleep(UNSETTLED_LOOK) => {}
                () = stop.cancelled() => break,
            }
        }
        if stop.is_cancelled() {
            break;
        }
        // Wait for room for the whole claim: claiming whatever little room there is would turn
        // one full claim into many small ones (each an API request on SQS).
        let asked = shared.claim_size();
        tokio::select! {
            permits = room.acquire_many(asked as u32) => permits.expect("the semaphore is never closed").forget(),
            () = stop.cancelled() => break,
        }
        // The pace may have changed while this claimer waited for room: it reserves what fits
        // now, at most what it asked for, and gives the rest of the room back.
        let want = tokio::select! {
            want = shared.wait_for_pace(asked) => want,
            () = stop.cancelled() => {
                room.add_permits(asked);
                break;
            }
        };
        room.add_permits(asked - want);
        // Paused kinds are not claimed (where the backend claims by kind) until their probe is
        // due: their jobs stay queued, untouched.
        shared.refresh_flow().await;
        let claimable = shared.flowing.claimable(&shared.claiming.kinds).filter(|_| shared.caps.claim_by_kind);
        let kinds = claimable.as_ref().unwrap_or(&shared.claiming.kinds);
        if *kinds == Kinds::Only(vec![]) {
            room.add_permits(want);
            shared.claiming.buffered.fetch_sub(want, Ordering::Relaxed); // the reservation
            shared.claiming.room_made();
            tokio::select! {
                () = tokio::time::sleep(shared.config.poll) => {}
                () = stop.cancelled() => {}
            }
            continue;
        }
        let claimed = match shared.queue.claim(kinds, want, shared.claim_lease, shared.config.poll).await {
            Ok(claimed) => {
                failures = 0;
                claimed
            }
            Err(e) => {
                room.add_permits(want);
                shared.claiming.buffered.fetch_sub(want, Ordering::Relaxed); // the reservation
                shared.claiming.room_made();
                failures += 1;
                let pause =
                    Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10), ..Backoff::default() };
                warn!(error = %e, "claim failed; pausing");
                tokio::select! {
                    () = tokio::time::sleep(pause.delay(failures)) => {}
                    () = stop.cancelled() => {}
                }
                continue;
            }
        };
        // The room and the reservation made for `want` become the jobs that came.
        let unfilled = want.saturating_sub(claimed.len());
        room.add_permits(unfilled);
        shared.claiming.buffered.fetch_sub(unfilled, Ordering::Relaxed);
        if unfilled > 0 {
            shared.claiming.room_made();
        }
        let now = Instant::now();
        for job in claimed {
            shared.counters.add_for(Count::Claimed, &job.job.kind, 1);
            // The dispatcher outlives every claimer, so this cannot fail.
            let _ = buffer.send((now, job));
        }
    }
}

async fn dispatch<Q: Claim + DeadLetter + 'static, L: Ledger + 'static>(
    shared: Arc<Shared<Q, L>>,
    mut waiting: mpsc::UnboundedReceiver<(Instant, Claimed)>,
    room: Arc<Semaphore>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::clone(&shared.claiming.slots);
    // Jobs between dispatch and settlement. A handler's slot is freed as soon as it returns, so
    // settlements (batched by the backend) overlap the next handlers; this bounds how many wait.
    let outstanding =
        Arc::new(Semaphore::new((4 * shared.batch() * shared.config.claimers).max(shared.config.concurrency)));
    // Jobs that shutdown caught before they started. They are handed back only once every
    // claimer has stopped, so no claim of this worker can take them again.
    let mut unstarted = Vec::new();
    while let Some((claimed_at, job)) = waiting.recv().await {
        room.add_permits(1);
        let permits = tokio::select! {
            permits = async {
                let out = Arc::clone(&outstanding).acquire_owned().await;
                let slot = Arc::clone(&slots).acquire_owned().await;
                out.and_then(|out| slot.map(|slot| (out, slot)))
            }, if !stop.is_cancelled() => Some(permits.expect("the semaphores are never closed")),
            () = stop.cancelled() => None,
        };
        // Counted as waiting until it has its handler slot, so that no claim is made for the
        // slot it is about to take.
        shared.claiming.buffered.fetch_sub(1, Ordering::Relaxed);
        shared.claiming.room_made();
        let Some((out, slot)) = permits else {
            unstarted.push(job);
            continue;
        };
        let span = job_span(&job, &shared.messaging);
        let shared = Arc::clone(&shared);
        tracker.spawn(
            async move {
                shared.process(job, claimed_at, slot, out).await;
                // Its slot is free again, however the attempt ended (a hand-back, a skip, a
                // record): that is room for a claim.
                shared.claiming.room_made();
            }
            .instrument(span),
        );
    }
    for job in unstarted {
        let span = job_span(&job, &shared.messaging);
        let shared = Arc::clone(&shared);
        tracker.spawn(async move { shared.give_back(&job).await }.instrument(span));
    }
}

impl<Q: Claim + DeadLetter, L: Ledger> Shared<Q, L> {
    /// The most jobs one claim asks for: `batch`, within what the backend returns at most.
    fn batch(&self) -> usize {
        self.config.batch.min(self.caps.max_claim).max(1)
    }

    /// How many jobs may wait claimed: what the handlers get through in [`CLAIM_AHEAD`], or
    /// as many as there are idle handlers, whichever is more. Slow jobs are thus claimed only for
    /// a handler that is free, never to wait behind a running one for longer than their claim
    /// lease.
    fn room(&self) -> usize {
        let claiming = &self.claiming;
        claiming.pace.ahead(&self.config, self.claim_lease).max(claiming.slots.available_permits())
    }

    /// Jobs to ask for in one claim: the claimers' share of the [`room`](Self::room), the whole
    /// batch or less rounded down to a power of two (a backend may prepare a statement per size:
    /// it sees few). Never more than the room, or the claim could wait for room that never comes.
    fn claim_size(&self) -> usize {
        claim_count(self.room().div_ceil(self.config.claimers.max(1)).min(self.batch()), self.batch())
    }

    /// Waits until the buffer has room below the [`room`](Self::room), then reserves places in
    /// it (in `buffered`) for up to `want` jobs, as many as fit now (see [`claim_count`]), so
    /// that two claimers never both claim for the same idle handler. Returns how many.
    async fn wait_for_pace(&self, want: usize) -> usize {
        loop {
            let taken = self.claiming.taken.notified();
            let mut taken = std::pin::pin!(taken);
            // Registered before looking, so a job taken in between is not missed.
            taken.as_mut().enable();
            let buffered = self.claiming.buffered.load(Ordering::Relaxed);
            let free = self.room().saturating_sub(buffered);
            if free > 0 {
                let take = claim_count(want.min(free), self.batch());
                let reserved = self.claiming.buffered.compare_exchange(
                    buffered,
                    buffered + take,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                if reserved.is_ok() {
                    return take;
                }
                continue; // another claimer reserved meanwhile: look again
            }
            taken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::claim_count;

    #[test]
    fn a_claim_takes_the_whole_batch_or_a_power_of_two_below_it() {
        assert_eq!(claim_count(10, 10), 10, "SQS's ten, not eight");
        assert_eq!(claim_count(40, 10), 10);
        assert_eq!(claim_count(9, 10), 8);
        assert_eq!(claim_count(100, 128), 64);
        assert_eq!(claim_count(128, 128), 128);
        assert_eq!(claim_count(0, 10), 1);
    }
}
