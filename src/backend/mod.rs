//! Backends: where a rule's counters live.
//!
//! [`local`] keeps them in this process with `governor`.

pub mod failure;
pub(crate) mod deny_cache;
pub(crate) mod local;
