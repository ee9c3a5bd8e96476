//! [`QueueStats`]: how many jobs a queue holds.

use std::future::Future;
use std::time::Duration;

use crate::error::Result;

/// How many jobs a queue holds, by state. Finished jobs and failure records are not counted
/// (see [`DeadLetter::count_open`](super::DeadLetter::count_open) for those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Waiting to be claimed: ready now, or after a retry's delay.
    pub queued: u64,
    /// Claimed and not settled yet: a handler is on them, or their lease lapsed and they have
    /// not been taken again.
    pub running: u64,
    /// Of `queued`, those waiting for a time (a retry's delay, a deferral, a delayed send), not
    /// ready yet. `None` where the broker cannot tell (Azure).
    pub scheduled: Option<u64>,
    /// How long the oldest ready job has waited since it became ready: the figure that says a
    /// queue is falling behind. `None` when nothing is ready, or where the broker cannot tell
    /// (SQS, Azure: read their own metrics, `ApproximateAgeOfOldestMessage` on SQS).
    pub oldest_ready: Option<Duration>,
}

impl Counts {
    /// Queued and running together: the jobs not finished yet.
    pub fn unfinished(&self) -> u64 {
        self.queued + self.running
    }

    /// Nothing queued, nothing running.
    pub fn is_drained(&self) -> bool {
        self.unfinished() == 0
    }
}

/// Counts a queue's jobs: the figures a dashboard, a test or a deploy script reads.
pub trait QueueStats: Send + Sync {
    /// The jobs queued and running now. Exact where the backend stores jobs (memory, Postgres);
    /// approximate where the broker only estimates (SQS).
    fn counts(&self) -> impl Future<Output = Result<Counts>> + Send;
}

/// Conveniences over [`QueueStats`].
pub trait QueueStatsExt: QueueStats {
    /// Waits until nothing is queued or running, or `timeout` passes, looking every 50 ms at
    /// first and every second at most. Returns the last counts read: drained
    /// ([`Counts::is_drained`]), or what was left when the time ran out.
    fn wait_until_drained(&self, timeout: Duration) -> impl Future<Output = Result<Counts>> + Send {
        async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut pause = Duration::from_millis(50);
            loop {
                let counts = self.counts().await?;
                let now = tokio::time::Instant::now();
                if counts.is_drained() || now >= deadline {
                    return Ok(counts);
                }
                tokio::time::sleep(pause.min(deadline - now)).await;
                // Each look is a query (or, on SQS, a billed request): look less often as it waits.
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl<T: QueueStats + ?Sized> QueueStatsExt for T {}
