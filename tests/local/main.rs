//! Local limits, with no optional feature: HTTP, headers, control, costs,
//! calendars, waits and concurrency (their Redis cases where `redis` is on).

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod auth;
mod calendar;
mod concurrency;
mod control;
mod cost;
mod draft;
mod durations;
mod http_layer;
#[cfg(feature = "metrics")]
mod keyspace;
mod service;
#[cfg(feature = "metrics")]
mod shadow;
mod wait;
