//! Backends: where a rule's counters live.
