//! The layers in process and over real HTTP and gRPC clients: headers,
//! control, costs, calendars, waits, concurrency, rule files and reload,
//! every duration setting at its extremes, and the module graph. No test
//! here starts a `redis-server`: their Redis cases are in tests/redis.

#[path = "../support/mod.rs"]
mod support;

mod any_of;
mod architecture;
mod auth;
mod bandwidth;
mod calendar;
mod concurrency;
#[cfg(feature = "config")]
mod config;
mod control;
mod cost;
#[cfg(feature = "metrics")]
mod counted;
mod dependencies;
mod deploy;
mod docs;
mod draft;
mod durations;
#[cfg(feature = "metrics")]
mod exempt;
#[cfg(feature = "tonic")]
mod grpc;
mod http_layer;
#[cfg(feature = "metrics")]
mod keyspace;
#[cfg(feature = "metrics")]
mod logs;
mod misconfig;
#[cfg(feature = "metrics")]
mod misplaced;
mod quota_change;
#[cfg(all(feature = "config", feature = "metrics"))]
mod reload;
mod service;
#[cfg(feature = "metrics")]
mod shadow;
mod snapshot;
mod wait;
