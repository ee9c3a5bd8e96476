//! Grouping of concurrent writes into one statement, for a backend whose settlements are rows
//! (Postgres's completions and ledger, pgmq's deletes): each call sends a request, carrying its
//! own reply, and a loop hands the waiting requests to `flush` together.
//!
//! No timer and no added latency: with no group in flight, whatever waits goes at once, so groups
//! stay at one under light load. With one in flight, another starts only for a worthwhile group
//! ([`GroupLimits::worth`]); smaller ones wait for a flush to end and go with what arrived
//! meanwhile, so groups grow with load instead of splitting into statements of one.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

/// How a [`Grouper`] forms its groups.
#[derive(Debug, Clone, Copy)]
pub struct GroupLimits {
    /// Requests in one group at most.
    pub max: usize,
    /// Groups being flushed at once at most.
    pub in_flight: usize,
    /// Requests that justify a group beside one already in flight.
    pub worth: usize,
}

/// Sends requests to a loop that flushes them in groups; see the [module](self).
#[derive(Debug)]
pub struct Grouper<R> {
    tx: mpsc::UnboundedSender<R>,
}

impl<R: Send + 'static> Grouper<R> {
    /// Starts the loop (on the current Tokio runtime); it ends when the grouper is dropped.
    /// `flush` answers each request of its group through the request's own reply.
    pub fn start<F, Fut>(limits: GroupLimits, flush: F) -> Self
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(group_loop(limits, rx, flush));
        Self { tx }
    }

    /// Queues `request` for the next group; `Err` gives it back if the loop has stopped.
    pub fn send(&self, request: R) -> Result<(), R> {
        self.tx.send(request).map_err(|e| e.0)
    }
}

/// Frees a flush's slot and says so however its task ends (a panic included), so that a small
/// group waiting for the slot is not left waiting.
struct Finished {
    signal: Arc<Notify>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.signal.notify_one();
    }
}

async fn group_loop<R, F, Fut>(limits: GroupLimits, mut rx: mpsc::UnboundedReceiver<R>, flush: F)
where
    R: Send + 'static,
    F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let max = limits.max.max(1);
    let slots = Arc::new(Semaphore::new(limits.in_flight.max(1)));
    let finished = Arc::new(Notify::new());
    loop {
        let mut group = Vec::new();
        if rx.recv_many(&mut group, max).await == 0 {
            return;
        }
        while slots.available_permits() < limits.in_flight.max(1) && group.len() < limits.worth {
            let room = max - group.len();
            tokio::select! {
                () = finished.notified() => break,
                n = rx.recv_many(&mut group, room) => if n == 0 { break },
            }
        }
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let done = Finished { signal: Arc::clone(&finished), _slot: slot };
        let flushing = flush(group);
        tokio::spawn(async move {
            flushing.await;
            drop(done);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn requests_waiting_while_a_group_is_in_flight_go_together() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let limits = GroupLimits { max: 100, in_flight: 1, worth: 32 };
        let grouper = Grouper::start(limits, {
            let sizes = Arc::clone(&sizes);
            move |group: Vec<oneshot::Sender<()>>| {
                sizes.lock().unwrap().push(group.len());
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    for reply in group {
                        let _ = reply.send(());
                    }
                }
            }
        });
        let call = || {
            let (reply, answer) = oneshot::channel();
            grouper.send(reply).unwrap();
            answer
        };
        let mut answers = vec![call()];
        // Once the first group is being flushed, nine more arrive while it is in flight.
        while sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        answers.extend((0..9).map(|_| call()));
        for answer in answers {
            answer.await.unwrap();
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes, [1, 9], "the first goes at once; the rest wait for it and go as one");
    }
}
