//! The drain: the dead-letter queue's messages moved into the record store.

use std::time::Duration;

use tracing::info;

use super::Broker;
use crate::backend::FailureRecord;
use crate::error::Result;

/// Dead-letter pages a drain takes at most in one go; the rest wait for the next read.
const DRAIN_PAGES: usize = 2_000;
/// How long a drain hides a dead-letter message between receiving it and deleting it once kept.
const DRAIN_HIDE: Duration = Duration::from_secs(60);

/// Moves the dead-letter queue's messages into the store: each received, kept, then deleted.
/// Safe to run from many processes at once (each takes other messages) and to repeat (a record
/// is kept once by its id). A message received by a drain that died is taken again a minute
/// later.
pub async fn drain<B: Broker>(broker: &B) -> Result<()> {
    let core = broker.core();
    let _draining = core.draining.lock().await;
    for _ in 0..DRAIN_PAGES {
        let drained = broker.receive_dead(DRAIN_HIDE).await?;
        if drained.is_empty() {
            return Ok(());
        }
        let records: Vec<FailureRecord> = drained.iter().map(|d| d.record.clone()).collect();
        match core.records().keep_records(core.scope(), &records).await {
            Ok(0) => {}
            Ok(new) => info!(records = new, "failure records taken from the dead-letter queue"),
            Err(e) => {
                broker.show_dead_again(&drained).await;
                return Err(e);
            }
        }
        // A message not deleted comes back and is kept again, which changes nothing.
        broker.delete_dead(&drained).await?;
    }
    Ok(())
}
