//! Where a process's claims start scanning the ready index.

use std::cmp::Reverse;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long a scan floor is trusted before a claim scans the ready index from the front again.
const FLOOR_TTL: Duration = Duration::from_secs(1);

/// Where this process's claims start scanning the ready index: the (priority, run_at, id) at
/// which its last full batch ended; a claim from it reads that priority alone (see `claim.sql`). A job can still become ready behind it (a claim rolled back, an enqueue that
/// commits late in a long transaction), so the floor lasts [`FLOOR_TTL`] and is dropped whenever a
/// claim comes back short. Each floor set from a scan of the front starts a new generation, and
/// only claims that started from the current generation may raise it: a claim in flight from an
/// older floor cannot carry the floor past the jobs a newer front scan is working through.
#[derive(Default)]
pub(super) struct ScanFloor {
    at: Option<(Position, tokio::time::Instant)>,
    generation: u64,
}

/// A place in the ready index: `(priority, run_at, id)`.
pub(super) type Position = (i16, DateTime<Utc>, i64);

impl ScanFloor {
    /// The floor to start a claim from (`None`: the front), and its generation.
    pub(super) fn read(&mut self) -> (Option<Position>, u64) {
        if self.at.is_some_and(|(_, since)| since.elapsed() >= FLOOR_TTL) {
            self.reset();
        }
        (self.at.map(|(at, _)| at), self.generation)
    }

    /// After a claim that started in `generation` and took `end` (its last job's position) in a
    /// full batch, or `None` when the batch came back short.
    pub(super) fn settle(&mut self, generation: u64, scanned_front: bool, end: Option<Position>) {
        match end {
            None => self.reset(),
            Some(end) if scanned_front => {
                self.generation += 1;
                self.at = Some((end, tokio::time::Instant::now()));
            }
            Some(end) => {
                if let Some((at, _)) = self.at.as_mut().filter(|_| generation == self.generation) {
                    // Further along the index: a lower priority, or later within one.
                    *at = std::cmp::max_by_key(*at, end, |(priority, at, id)| (Reverse(*priority), *at, *id));
                }
            }
        }
    }

    fn reset(&mut self) {
        self.generation += 1;
        self.at = None;
    }
}
