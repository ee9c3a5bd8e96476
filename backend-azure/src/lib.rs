//! Azure Queue Storage backend for [redrive](https://docs.rs/redrive): the foundations.
//!
//! Microsoft's `azure_storage_queue` client authenticates with Entra ID tokens only; accounts
//! used with a shared key, and the Azurite emulator, are reached here through a SharedKey
//! signing policy of this crate's own ([`AzureConfig`] builds the client with it). The service
//! version is pinned to [`SERVICE_VERSION`], which Azurite 3.35 (the newest that runs on Node 20)
//! accepts.
//!
//! The queue contracts (claim by dequeue count, the `-poison` queue, records in a
//! [`RecordStore`](redrive_core::RecordStore)) build on this; see `docs/ARCHITECTURE.md`.

mod config;
mod shared_key;

/// The Azure SDK this crate is built with: [`AzureConfig::queue_client`] gives its client.
pub use azure_storage_queue;
pub use config::{AzureConfig, SERVICE_VERSION};
