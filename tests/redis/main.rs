//! Global limits on private `redis-server` processes and a private
//! cluster: algorithms, layers, coalescing, leases, failure modes, TLS,
//! stress and the chaos soak.

#[path = "../support/mod.rs"]
mod support;

mod algorithms;
mod any_of;
mod bandwidth;
mod calendar;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod coalesce;
mod concurrency;
#[cfg(feature = "config")]
mod config;
mod control;
mod cost;
mod describe;
mod draft;
mod durations;
#[cfg(feature = "metrics")]
mod exempt;
#[cfg(feature = "metrics")]
mod exposition;
mod fallback;
mod invariants;
#[cfg(feature = "metrics")]
mod late_refund;
#[cfg(feature = "metrics")]
mod layer;
mod lazy;
mod lease;
#[cfg(feature = "metrics")]
mod operators;
mod quota_change;
mod recovery;
mod rolling_reload;
mod rolling_restart;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod soak;
mod stress;
#[cfg(all(feature = "redis-tls", feature = "redis-cluster"))]
mod tls;
mod together;
mod wait;
mod warnings;
mod window_lease;
