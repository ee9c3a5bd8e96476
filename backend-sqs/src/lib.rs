//! Amazon SQS backend for [redrive](https://docs.rs/redrive).
//!
//! The source queue carries each job as a [JSON envelope](redrive_core::kit::Envelope), with its
//! kind, key and provider key repeated as message attributes. The attempt is SQS's
//! `ApproximateReceiveCount` plus the attempts a deferred copy carries over (`redrive-spent`);
//! the lease is the visibility timeout and the receipt handle.
//!
//! | ability | how |
//! |---|---|
//! | enqueue | `SendMessage` / `SendMessageBatch` (≤ 10); FIFO: group and deduplication id from the key |
//! | dedupe | standard queues: none at enqueue, the effect ledger dedupes; FIFO: SQS's 5-minute window |
//! | claim | `ReceiveMessage`, long polling, ≤ 10 at a time, of any kind (SQS cannot filter: the worker defers kinds it has no handler for) |
//! | complete | batched `DeleteMessageBatch`, shared by concurrent completions |
//! | retry, renew, release | `ChangeMessageVisibility`; every receive stays counted |
//! | defer | send a copy with the spent attempts and `DelaySeconds` (≤ 15 min), then delete the original: deferrals never count against `maxReceiveCount`. FIFO queues refuse a per-message delay: there a deferral is `ChangeMessageVisibility` and counts |
//! | dead letter | the worker keeps the record in the [`RecordStore`](redrive_core::kit::RecordStore) (the application's database), then deletes the message; the redrive policy's `maxReceiveCount` is the safety net for crashes |
//! | failure records | read from the store: complete, paged, hiding nothing from other readers; the DLQ (what the redrive policy moved, and records written while the store was down) is drained into it first |
//! | replay | take the record in the store (no other process sends it), send back to the source with the original keys, close the record |
//! | effect ledger | not here: pass your database's (e.g. `redrive-postgres`) to the worker |
//!
//! SQS cannot give a receive back: a worker that dies holding messages it had not started yet
//! charges each of them an attempt (no crash refunds), and so does a release.
//!
//! Start-up refuses a queue without a redrive policy, a missing DLQ, a DLQ that does not keep
//! messages longer than the source, and a record store that is not migrated; enqueue refuses a job whose cap is above
//! the policy's `maxReceiveCount`, and a message over the queue's `MaximumMessageSize`.

mod backend;
mod config;
mod delete;
mod error;

pub use backend::SqsBackend;
pub use config::{QueueSetup, SqsConfig};
