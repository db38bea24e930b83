//! Where a rule's counters live in this process: the keyed state stores
//! under the engine.
//!
//! - `local`: the `governor` store of local rules, with its reload
//!   hand-over (`inherit`, `carry`);
//! - `keyspace`: the bounded key space every store sits on;
//! - `calendar`: calendar-aligned quotas;
//! - `lock`: lockouts;
//! - with the `redis` feature, what the Redis backend keeps beside it:
//!   `leases` of quota taken from Redis, the `deny_cache`, what the
//!   fallback `learned` from Redis's answers, and the `bounded` map they
//!   use.

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
