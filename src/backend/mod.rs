//! Backends: where a rule's counters live.
//!
//! - `local` keeps them in this process with `governor` (local scope).
//! - `redis` keeps them in a shared Redis, decided by Lua scripts (global
//!   scope; feature `redis`).

#[cfg(feature = "redis")]
pub(crate) mod bounded;
pub(crate) mod calendar;
mod carry;
#[cfg(feature = "redis")]
pub(crate) mod deny_cache;
pub(crate) mod inherit;
pub(crate) mod keyspace;
#[cfg(feature = "redis")]
pub(crate) mod learned;
#[cfg(feature = "redis")]
pub(crate) mod leases;
pub(crate) mod local;
pub(crate) mod lock;
#[cfg(feature = "redis")]
pub mod redis;
