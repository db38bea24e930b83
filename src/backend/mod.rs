//! Backends: where a rule's counters live.
pub mod redis;
