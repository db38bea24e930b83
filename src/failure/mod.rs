#![cfg_attr(feature = "redis", doc = include_str!("../../docs/failure.md"))]
#![cfg_attr(
    not(feature = "redis"),
    doc = "What a global (Redis) rule does when Redis fails: failure modes, the timeout and the circuit breaker. Needs feature `redis`."
)]

mod breaker;
#[cfg(feature = "redis")]
mod guard;
#[cfg(feature = "redis")]
mod live_count;
#[cfg(feature = "redis")]
mod liveness;

pub use crate::policy::{BreakerConfig, FailureMode};
#[cfg(feature = "redis")]
pub(crate) use breaker::Admit;
pub use breaker::{BreakerState, BreakerStatus};
#[cfg(feature = "redis")]
pub(crate) use guard::{CallError, Guard, PATIENCE};
#[cfg(feature = "redis")]
pub(crate) use live_count::LiveCount;
#[cfg(feature = "redis")]
pub(crate) use liveness::{Heard, Liveness};

#[cfg(feature = "redis")]
use crate::Source;

#[cfg(feature = "redis")]
impl FailureMode {
    pub(crate) fn source(self) -> Source {
        match self {
            Self::FailOpen => Source::FailOpen,
            Self::FailClosed => Source::FailClosed,
            Self::LocalFallback => Source::Fallback,
        }
    }
}
