//! The rule engine the rate-limit layer runs. A layer's rules are compiled
//! into a [`Chain`] (`chain`), every build-time check is in `validate`,
//! one request's steps through one rule are in `decide`, what a request
//! spent and how it is settled or refunded in `spend`, the queues of
//! `OnDeny::Wait` in `wait`, and the control handle's operations in
//! `control`. Global rules add their Redis part: exact, coalesced
//! (`coalesce`) and leased decisions in `global`, and their decisions
//! without Redis (the failure mode, the fallback that starts each key from
//! Redis's last answer) in `fallback`.

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
pub(crate) use spend::Settlement;
#[cfg(feature = "redis")]
pub(crate) use validate_global::validate_global;
