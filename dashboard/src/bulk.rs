//! Bulk replays and discards started from the dashboard: each runs on its own task (a replay at a
//! capped rate), and its progress page reads the counters it moves.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::{FailureId, ReplayOutcome};

use crate::{App, Records};

/// One bulk replay or discard.
pub(crate) struct Run {
    /// A discard (`true`) or a replay.
    pub(crate) discard: bool,
    pub(crate) filter: String,
    pub(crate) by: String,
    pub(crate) reason: String,
    pub(crate) total: u64,
    /// Replayed or discarded.
    pub(crate) done: AtomicU64,
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

    /// Starts replaying `ids` (`per_second` at most), or discarding them (`per_second` `None`),
    /// each as `by` for `reason`; its number, from 1.
    pub(crate) fn start<B: Records>(
        &self,
        app: Arc<App<B>>,
        ids: Vec<FailureId>,
        per_second: Option<u32>,
        filter: String,
        by: String,
        reason: String,
    ) -> usize {
        let run = Arc::new(Run {
            discard: per_second.is_none(),
            filter,
            by,
            reason,
            total: ids.len() as u64,
            done: AtomicU64::new(0),
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
            let mut pace = per_second.map(|n| tokio::time::interval(Duration::from_secs(1) / n.max(1)));
            for id in ids {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                let counter = match step(&app, &run, &id).await {
                    Ok(true) => &run.done,
                    Ok(false) => &run.closed,
                    Err(e) => {
                        let what = if run.discard { "bulk discard" } else { "bulk replay" };
                        tracing::warn!(record = %id, by = %run.by, error = %e, "{what} stopped");
                        *run.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("stopped at {id}: {e}"));
                        break;
                    }
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            run.finished.store(true, Ordering::Release);
        });
        number
    }
}

/// Replays or discards one record: `false` if it was closed already (replayed, or discarded, by
/// someone else meanwhile), and then left as it is.
async fn step<B: Records>(app: &App<B>, run: &Run, id: &FailureId) -> redrive_core::Result<bool> {
    if !run.discard {
        return Ok(matches!(app.backend.replay(id, &run.reason, &run.by).await?, ReplayOutcome::Replayed(_)));
    }
    if !app.backend.get(id).await?.state.is_open() {
        return Ok(false);
    }
    app.backend.discard(id, &run.reason, &run.by).await?;
    Ok(true)
}
