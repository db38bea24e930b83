//! The rule engine the rate-limit and bandwidth layers run (the
//! concurrency layer keeps its own, and uses only the Redis build checks).
//! A layer's rules are
//! compiled into a [`Chain`] (`chain`) of rules as the engine runs them
//! (`rule`, their any-of groups in `any_of`); every build-time check is in
//! `validate` (`validate_global` for Redis); one request's steps through
//! one rule are in `decide`, what a request spent and how it is settled or
//! refunded in `spend`, the queues of `OnDeny::Wait` in `wait`, the control
//! handle's operations in `control`, and a chain's counters saved and
//! loaded in `snapshot`. The bandwidth layer spends one rule by the byte
//! through `meter`. Global rules add their Redis part: exact decisions in
//! `global`, coalesced ones in `coalesce`, leased ones in `lease`, their
//! decisions without Redis (the failure mode, the fallback that starts
//! each key from Redis's last answer) in `fallback`, and the conversion
//! after a quota change in `quota_change`. `tests` holds the unit tests.

mod any_of;
mod chain;
#[cfg(feature = "redis")]
mod coalesce;
mod control;
mod decide;
#[cfg(feature = "redis")]
mod fallback;
#[cfg(feature = "redis")]
mod global;
#[cfg(feature = "redis")]
mod lease;
mod meter;
#[cfg(feature = "redis")]
mod quota_change;
mod rule;
mod snapshot;
mod spend;
mod validate;
#[cfg(feature = "redis")]
mod validate_global;
mod wait;

#[cfg(test)]
mod tests;

pub(crate) use chain::{Chain, ChainConfig, Suspended};
pub use control::ControlError;
pub(crate) use control::ControlOp;
pub(crate) use decide::Verdict;
pub(crate) use meter::Meter;
pub(crate) use rule::Carry;
pub(crate) use spend::Settlement;
#[cfg(feature = "redis")]
pub(crate) use validate_global::validate_global;
