//! Shared helpers for integration tests.
pub mod admits;
pub mod gateway;
pub mod redis_cluster;
pub mod redis_server;
pub mod soak;
