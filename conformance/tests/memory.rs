//! The whole suite against the in-memory backend, the reference.

async fn memory() -> redrive_conformance::Subject<redrive_core::MemoryBackend, redrive_core::MemoryBackend> {
    redrive_conformance::memory()
}

redrive_conformance::suite!(memory());
