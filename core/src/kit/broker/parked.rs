//! Requests a push service holds open (QStash's deliveries, Inngest's calls), parked in this
//! process until a worker's verdict answers them.
//!
//! A push service calls the application's endpoint and waits for the answer, which is the
//! settlement. The endpoint verifies the request, [`park`](Parked::park)s its job, and waits in
//! [`Parked::verdict`]; the workers [`claim`](Parked::claim) parked calls under a lease token as
//! they claim jobs elsewhere, and settle one by [`settle`](Parked::settle) then
//! [`Call::answer`]. A call no worker claims in time, or whose lease lapses, is answered as the
//! backend decides ([`Lapse`]); one whose connection closes first is forgotten, so no worker runs
//! a job whose request is gone.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::warn;

use super::Held;
use crate::backend::{Claimed, Kinds, Lease};
use crate::error::{Error, ErrorKind, Result};
use crate::job::JobRecord;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lease_lost() -> Error {
    Error::new(ErrorKind::LeaseLost, "the call's lease is no longer held: it lapsed or was settled")
}

/// One parked request: its job, the backend's own `T` (reachable through `Deref`), and where its
/// verdict `V` goes.
pub struct Call<T, V> {
    /// The job the request carries.
    pub job: JobRecord,
    data: T,
    /// When the service stops waiting for the answer, less a margin to send it.
    pub answer_by: Instant,
    /// When, unclaimed, it is answered as [`Lapse::Unclaimed`] (within `answer_by`).
    pub unclaimed_by: Instant,
    state: Mutex<State>,
    /// Told when the state changes, so the waiting request looks at its deadline again.
    changed: Notify,
    verdict: Mutex<Option<oneshot::Sender<V>>>,
}

impl<T, V> std::ops::Deref for Call<T, V> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.data
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Waiting,
    Claimed { token: String, until: Instant },
    Settled,
}

impl<T, V> Call<T, V> {
    /// Whether the request still waits for its answer.
    pub fn waits(&self) -> bool {
        lock(&self.verdict).as_ref().is_some_and(|sender| !sender.is_closed())
    }

    /// Sends the verdict; `LeaseLost` if it was sent before or the request is gone (the service
    /// stopped waiting, and calls again).
    pub fn answer(&self, verdict: V) -> Result<()> {
        let sender = lock(&self.verdict).take().ok_or_else(lease_lost)?;
        sender.send(verdict).map_err(|_| lease_lost())
    }
}

/// Why a parked call's time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// No worker claimed it by its `unclaimed_by`: it goes back, no attempt spent.
    Unclaimed,
    /// Its worker's lease lapsed (the worker died or stalled): the service calls again, and that
    /// costs the attempt.
    LeaseLapsed,
}

/// A place among the calls held open, given back when dropped.
pub struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The calls this process holds open: waiting for a worker, oldest first, and claimed ones by
/// lease token. One lock order everywhere: the waiting list, then a call's state, then the held
/// table.
pub struct Parked<T, V> {
    waiting: Mutex<VecDeque<Arc<Call<T, V>>>>,
    arrived: Notify,
    held: Held<Arc<Call<T, V>>>,
    /// The kinds this process's claims have asked for (`None`: any kind).
    wanted: Mutex<Option<HashSet<String>>>,
    /// Requests open here (parked, claimed or being answered), at most `bound`.
    open: AtomicUsize,
    bound: usize,
}

impl<T, V> Parked<T, V> {
    /// Holds at most `bound` requests open at once ([`slot`](Self::slot)).
    pub fn new(bound: usize) -> Self {
        Self {
            waiting: Mutex::new(VecDeque::new()),
            arrived: Notify::new(),
            // Each call lapses on its own timer: nothing is left to drop by age.
            held: Held::unbounded(),
            wanted: Mutex::new(Some(HashSet::new())),
            open: AtomicUsize::new(0),
            bound,
        }
    }

    /// A place for one more open request, or `None` at the bound: refuse it unread.
    pub fn slot(&self) -> Option<Slot<'_>> {
        let bound = self.bound;
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < bound).then_some(n + 1)).ok()?;
        Some(Slot(&self.open))
    }

    /// Parks a verified request's job for the workers; returns the call and where its verdict
    /// will come (wait for it with [`verdict`](Self::verdict)).
    pub fn park(
        &self,
        job: JobRecord,
        data: T,
        answer_by: Instant,
        unclaimed_by: Instant,
    ) -> (Arc<Call<T, V>>, oneshot::Receiver<V>) {
        let (sender, receiver) = oneshot::channel();
        let call = Arc::new(Call {
            job,
            data,
            answer_by,
            unclaimed_by: unclaimed_by.min(answer_by),
            state: Mutex::new(State::Waiting),
            changed: Notify::new(),
            verdict: Mutex::new(Some(sender)),
        });
        lock(&self.waiting).push_back(Arc::clone(&call));
        self.arrived.notify_waiters();
        (call, receiver)
    }

    /// Waits for the call's verdict. When its time runs out, `lapsed` makes the answer (a call
    /// settled meanwhile is not lapsed). `None` if no verdict came: the settling call was dropped.
    /// Dropped before a verdict (the connection closed), the call is forgotten: no worker starts
    /// it, and a claim of it can no longer settle; `service` names the caller in the log.
    pub async fn verdict<F, Fut>(
        &self,
        call: &Arc<Call<T, V>>,
        mut verdict: oneshot::Receiver<V>,
        service: &str,
        mut lapsed: F,
    ) -> Option<V>
    where
        F: FnMut(Lapse) -> Fut,
        Fut: Future<Output = V>,
    {
        let _gone = Forget { parked: self, call, service };
        loop {
            let wake = match &*lock(&call.state) {
                State::Waiting => call.unclaimed_by,
                State::Claimed { until, .. } => *until,
                State::Settled => call.answer_by + Duration::from_secs(5),
            };
            tokio::select! {
                answered = &mut verdict => return answered.ok(),
                () = call.changed.notified() => {}
                () = tokio::time::sleep_until(wake) => {
                    if let Some(lapse) = self.lapse(call) {
                        return Some(lapsed(lapse).await);
                    }
                    // Settled, and its verdict never came by the end (the settling call was
                    // dropped); before that, the settlement may still be on its way.
                    let settled = *lock(&call.state) == State::Settled;
                    if settled && Instant::now() >= call.answer_by + Duration::from_secs(5) {
                        return None;
                    }
                }
            }
        }
    }

    /// If the call's time ran out, takes it out of the waiting list or the held table and says
    /// why; a call settled or still in time is left.
    fn lapse(&self, call: &Arc<Call<T, V>>) -> Option<Lapse> {
        let now = Instant::now();
        let mut waiting = lock(&self.waiting);
        let mut state = lock(&call.state);
        let lapse = match &*state {
            State::Waiting if now >= call.unclaimed_by => {
                waiting.retain(|w| !Arc::ptr_eq(w, call));
                Lapse::Unclaimed
            }
            State::Claimed { token, until } if now >= *until => {
                self.held.remove(token, token);
                Lapse::LeaseLapsed
            }
            _ => return None,
        };
        *state = State::Settled;
        Some(lapse)
    }

    /// Forgets a call whose request is gone; whether it was still waiting or claimed.
    fn forget(&self, call: &Arc<Call<T, V>>) -> bool {
        let mut waiting = lock(&self.waiting);
        let mut state = lock(&call.state);
        match std::mem::replace(&mut *state, State::Settled) {
            State::Waiting => waiting.retain(|w| !Arc::ptr_eq(w, call)),
            State::Claimed { token, .. } => {
                self.held.remove(&token, &token);
            }
            State::Settled => return false,
        }
        true
    }

    /// Remembers the kinds a claim asks for: calls of others are unhandled here.
    fn want(&self, kinds: &Kinds) {
        let mut wanted = lock(&self.wanted);
        match (kinds, wanted.as_mut()) {
            (Kinds::Any, _) => *wanted = None,
            (Kinds::Only(kinds), Some(set)) => set.extend(kinds.iter().cloned()),
            (Kinds::Only(_), None) => {}
        }
    }

    /// Remembers the kinds a worker of this process handles (`Claim::handles`): a call of one
    /// that is paused is not a call nothing here handles.
    pub fn handles(&self, kinds: &Kinds) {
        self.want(kinds);
    }

    /// Whether a worker of this process handles `kind`, or a claim ever asked for it.
    pub fn wanted(&self, kind: &str) -> bool {
        lock(&self.wanted).as_ref().is_none_or(|set| set.contains(kind))
    }

    fn take(&self, kinds: &Kinds, max: usize, lease: Duration) -> Vec<Claimed> {
        let mut waiting = lock(&self.waiting);
        let mut taken = Vec::new();
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() && taken.len() < max {
            let wanted = kinds.wants(&waiting[i].job.kind) || waiting[i].job.undecodable.is_some();
            if !wanted {
                i += 1;
                continue;
            }
            let call = waiting.remove(i).expect("within the list");
            let token = uuid::Uuid::new_v4().to_string();
            // Only a waiting call is in the list: every change from waiting removes it, under
            // this lock.
            *lock(&call.state) = State::Claimed { token: token.clone(), until: (now + lease).min(call.answer_by) };
            call.changed.notify_one();
            let lease = Lease { job_id: call.job.id.clone(), token: token.clone() };
            taken.push(Claimed { job: call.job.clone(), lease, begun: None });
            self.held.insert(&token, &token, call);
        }
        taken
    }

    /// Claims up to `max` waiting calls of `kinds` under a lease of `lease` (at most to each
    /// call's `answer_by`), waiting up to `wait` for one to arrive.
    pub async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Vec<Claimed> {
        self.want(kinds);
        let deadline = Instant::now() + wait;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let taken = self.take(kinds, max, lease);
            if !taken.is_empty() || Instant::now() >= deadline {
                return taken;
            }
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The claimed call `lease` names, now settled: no other settlement or lapse can take it.
    /// Answer it with [`Call::answer`].
    pub fn settle(&self, lease: &Lease) -> Result<Arc<Call<T, V>>> {
        let call = self.held.remove(&lease.token, &lease.token).ok_or_else(lease_lost)?;
        let mut state = lock(&call.state);
        match &*state {
            State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                *state = State::Settled;
                drop(state);
                Ok(call)
            }
            _ => Err(lease_lost()),
        }
    }

    /// The claimed call `lease` names, still held.
    pub fn held(&self, lease: &Lease) -> Result<Arc<Call<T, V>>> {
        self.held.with(&lease.token, &lease.token, |call| Arc::clone(call)).ok_or_else(lease_lost)
    }

    /// Puts a claimed call back at the front of the waiting list, for another claim.
    pub fn release(&self, lease: &Lease) -> Result<()> {
        let call = self.held(lease)?;
        {
            let mut waiting = lock(&self.waiting);
            let mut state = lock(&call.state);
            let current =
                matches!(&*state, State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until);
            if !current || !call.waits() {
                return Err(lease_lost());
            }
            *state = State::Waiting;
            self.held.remove(&lease.token, &lease.token);
            waiting.push_front(Arc::clone(&call));
        }
        call.changed.notify_one();
        self.arrived.notify_waiters();
        Ok(())
    }

    /// Keeps a claimed call `by` longer, up to its `answer_by`.
    pub fn renew(&self, lease: &Lease, by: Duration) -> Result<()> {
        let call = self.held(lease)?;
        {
            let mut state = lock(&call.state);
            match &mut *state {
                State::Claimed { token, until } if *token == lease.token && Instant::now() <= *until => {
                    *until = (Instant::now() + by).min(call.answer_by);
                }
                _ => return Err(lease_lost()),
            }
        }
        call.changed.notify_one();
        Ok(())
    }

    /// Calls waiting for a worker, and claimed ones.
    pub fn counts(&self) -> (usize, usize) {
        (lock(&self.waiting).len(), self.held.len())
    }

    /// Whether any open call, waiting or claimed, satisfies `f`.
    pub fn any(&self, mut f: impl FnMut(&Call<T, V>) -> bool) -> bool {
        lock(&self.waiting).iter().any(|call| f(call)) || self.held.any(|call| f(call))
    }
}

/// Forgets its call when dropped before a verdict.
struct Forget<'a, T, V> {
    parked: &'a Parked<T, V>,
    call: &'a Arc<Call<T, V>>,
    service: &'a str,
}

impl<T, V> Drop for Forget<'_, T, V> {
    fn drop(&mut self) {
        if self.parked.forget(self.call) {
            let job = &self.call.job;
            warn!(job = %job.id, kind = %job.kind, key = %job.key, attempt = job.attempt,
                "a {} call's connection closed before its verdict; the service calls again", self.service);
        }
    }
}
