//! Backends that keep a rule's counters outside this process: [`redis`]
//! (feature `redis`), shared by every gateway.

pub mod redis;
