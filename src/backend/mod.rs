//! Backends: where a rule's counters live.
//!
//! - `local` keeps them in this process with `governor` (local scope).
//! - [`redis`] keeps them in a shared Redis, decided by Lua scripts (global scope).
//! - [`failure`] decides what a global rule does when Redis can't answer.

pub(crate) mod deny_cache;
pub mod failure;
pub(crate) mod local;
pub mod redis;
