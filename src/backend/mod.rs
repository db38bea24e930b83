//! Backends: where a rule's counters live.
//!
//! [`local`] keeps them in this process with `governor`.

pub(crate) mod local;
