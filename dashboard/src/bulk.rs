//! Bulk replays started from the dashboard: each runs on its own task at a capped rate, and its
//! progress page reads the counters it moves.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::{FailureId, ReplayOutcome};

use crate::{App, Records};

/// One bulk replay.
pub(crate) struct Run {
    pub(crate) filter: String,
    pub(crate) by: String,
    pub(crate) reason: String,
    pub(crate) total: u64,
    pub(crate) replayed: AtomicU64,
    pub(crate) closed: AtomicU64,
    pub(crate) failure: Mutex<Option<String>>,
    pub(crate) finished: AtomicBool,
}

#[derive(Default)]
pub(crate) struct Runs(Mutex<Vec<Arc<Run>>>);

impl Runs {
    pub(crate) fn get(&self, number: usize) -> Option<Arc<Run>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(number.checked_sub(1)?).cloned()
    }

    /// Starts replaying `ids`, `per_second` at most, each as `by` for `reason`; its number, from 1.
    pub(crate) fn start<B: Records>(
        &self,
        app: Arc<App<B>>,
        ids: Vec<FailureId>,
        per_second: u32,
        filter: String,
        by: String,
        reason: String,
    ) -> usize {
        let run = Arc::new(Run {
            filter,
            by,
            reason,
            total: ids.len() as u64,
            replayed: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            failure: Mutex::new(None),
            finished: AtomicBool::new(false),
        });
        let number = {
            let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
            runs.push(run.clone());
            runs.len()
        };
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
            for id in ids {
                pace.tick().await;
                match app.backend.replay(&id, &run.reason, &run.by).await {
                    Ok(ReplayOutcome::Replayed(_)) => run.replayed.fetch_add(1, Ordering::Relaxed),
                    Ok(ReplayOutcome::AlreadyClosed(_)) => run.closed.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::warn!(record = %id, by = %run.by, error = %e, "bulk replay stopped");
                        *run.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("stopped at {id}: {e}"));
                        break;
                    }
                };
            }
            run.finished.store(true, Ordering::Release);
        });
        number
    }
}
