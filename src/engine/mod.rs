//! The rule engine the rate-limit and bandwidth layers run (the
//! concurrency layer keeps its own, and uses only the Redis build checks).
//! A layer's rules are compiled into a [`Chain`]; each file below is one
//! step of that, in the order a request meets them. Global rules add their
//! Redis part, each file gated on the `redis` feature.

// Building: checks, then the compiled chain and its rules.
/// Any-of groups: members tried in order, the first allow wins.
mod any_of;
/// The compiled chain a layer runs, and its read-locked reload.
mod chain;
/// One rule as the engine runs it: its store, cost and headers.
mod rule;
/// Every build-time check of a chain's rules.
mod validate;
/// The build-time checks of global rules against their Redis backend.
#[cfg(feature = "redis")]
mod validate_global;

// Deciding one request.
/// One request's steps through one rule.
mod decide;
/// A rule spent by the byte, for the bandwidth layer.
mod meter;
/// What a request spent, and how it is settled or refunded.
mod spend;
/// The queues of `OnDeny::Wait`.
mod wait;

// Global rules on Redis.
/// Coalesced decisions: one script call per batch of a rule.
#[cfg(feature = "redis")]
mod coalesce;
/// Decisions without Redis: the failure mode, and the fallback that
/// starts each key from Redis's last answer.
#[cfg(feature = "redis")]
mod fallback;
/// A global rule's runtime, and its exact decisions.
#[cfg(feature = "redis")]
mod global;
/// Leased decisions: quota taken from Redis in advance.
#[cfg(feature = "redis")]
mod lease;
/// The conversion of Redis state after a quota change.
#[cfg(feature = "redis")]
mod quota_change;
/// A global rule's control operations and settlements.
#[cfg(feature = "redis")]
mod settle_global;

// Around the requests.
/// The control handle's operations.
mod control;
/// A rule deciding a key it is handed, with no request (the rate-limit service's door).
mod keyed;
/// A chain's counters saved and loaded.
mod snapshot;
/// Several keyed decisions made together: global rules' exact calls on
/// one Redis as one.
mod together;

#[cfg(test)]
mod tests;

pub(crate) use chain::{Chain, ChainConfig, Suspended};
pub use control::ControlError;
pub(crate) use decide::Verdict;
pub(crate) use meter::Meter;
pub(crate) use rule::Carry;
pub(crate) use spend::Settlement;
#[cfg(feature = "redis")]
pub(crate) use validate_global::validate_global;
