//! Azure Queue Storage backend for [redrive](https://docs.rs/redrive).
//!
//! The queue carries each job as its [JSON envelope](redrive_core::kit::Envelope) in the message text
//! (or in base64, for queues shared with Azure Functions; either is read). What redrive carries
//! across attempts (the receives given back by deferrals, the failed attempts' errors) is in the
//! envelope's `redrive` member, written by Update Message. The attempt is Azure's dequeue count
//! less the receives given back; the lease is the visibility timeout and the pop receipt.
//!
//! | ability | how |
//! |---|---|
//! | enqueue | Put Message (Azure has no batch send); never expires unless [`QueueOptions::time_to_live`] says |
//! | dedupe | none at enqueue: the effect ledger dedupes |
//! | claim | Get Messages, ≤ 32 at a time, of any kind (the worker defers kinds it has no handler for); no long polling |
//! | complete | Delete Message with the current pop receipt |
//! | renew | Update Message: Azure answers a new pop receipt, the new lease; a stale one is `LeaseLost` |
//! | retry | Update Message: the visibility and the error added to the text |
//! | defer, release | Update Message: the visibility and the receive given back, so never an attempt |
//! | dead letter | the worker keeps the record in the [`RecordStore`](redrive_core::kit::RecordStore) (the application's database), then deletes the message; with the store down, into `<queue>-poison` (never expires by default) |
//! | failure records | read from the store: complete, paged, hiding nothing; the poison queue is drained into it first |
//! | replay | take the record in the store (no other process sends it), send back with the original keys, close the record |
//! | effect ledger | not here: pass your database's (e.g. `redrive-postgres`) to the worker |
//!
//! Microsoft's `azure_storage_queue` client authenticates with Entra ID tokens only; accounts
//! used with a shared key, and the Azurite emulator, are reached here through a SharedKey
//! signing policy of this crate's own ([`AzureConfig`] builds the client with it). The service
//! version is pinned to [`SERVICE_VERSION`], which Azurite 3.35 (the newest that runs on Node 20)
//! accepts.
//!
//! A message is at most 64 KiB of text: enqueue refuses a job whose text, with the room its
//! retries' error history needs, would not fit (`PayloadTooLarge`, before anything is sent).

mod backend;
mod config;
mod doctor;
mod error;
mod shared_key;
mod wire;

/// The Azure SDK this crate is built with: [`AzureConfig::queue_client`] gives its client.
pub use azure_storage_queue;
pub use backend::AzureBackend;
pub use config::{AzureConfig, QueueOptions, RequestCounts, SERVICE_VERSION};
