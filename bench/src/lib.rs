//! What the measurement programs (`src/bin`) and benches of
//! `keyed-rate-limit` share, so that every figure in BENCHMARKS.md compares
//! the same setups. Unpublished.
#![allow(missing_docs)]

pub mod app;
pub mod ceiling;
#[cfg(feature = "redis-cluster")]
pub mod cpu;
#[cfg(feature = "redis-cluster")]
pub mod fleet;
#[cfg(feature = "redis")]
pub mod gateway;
pub mod spread;
