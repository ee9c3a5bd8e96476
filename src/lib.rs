//! redrive
