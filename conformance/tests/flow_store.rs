//! The checks every flow store passes, on the in-memory store: the reference the databases'
//! stores are held to. Two clones are two handles on one store.

use redrive_core::MemoryBackend;

async fn two_handles() -> (MemoryBackend, MemoryBackend) {
    let store = MemoryBackend::new();
    (store.clone(), store)
}

redrive_conformance::flow_store_checks!(two_handles());
