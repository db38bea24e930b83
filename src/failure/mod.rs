#![cfg_attr(feature = "redis", doc = include_str!("../../docs/failure.md"))]
#![cfg_attr(
    not(feature = "redis"),
    doc = "What a global (Redis) rule does when Redis fails: failure modes, the timeout and the circuit breaker. Needs feature `redis`."
)]

#[cfg(any(feature = "redis", feature = "rls"))]
mod breaker;
#[cfg(feature = "redis")]
mod guard;
#[cfg(feature = "redis")]
mod live_count;
#[cfg(feature = "redis")]
mod partial;
#[cfg(feature = "redis")]
mod reachability;
#[cfg(any(feature = "redis", feature = "rls"))]
mod reported;
mod status;

#[cfg(any(feature = "redis", feature = "rls"))]
pub(crate) use self::breaker::Admit;
#[cfg(feature = "rls")]
pub(crate) use self::reported::ReportedBreaker;
#[cfg(feature = "redis")]
pub(crate) use self::{
    guard::{CallError, Guard, PATIENCE, wait},
    live_count::LiveCount,
    reachability::{Heard, Reachability},
};
pub use crate::policy::{BreakerConfig, FailureMode};
pub use status::{BreakerState, BreakerStatus};
