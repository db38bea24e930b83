//! A breaker's state as operators see it, under every feature set.

use std::time::Duration;

/// The breaker's state, as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to Redis.
    Closed,
    /// Calls skip Redis until the open period ends.
    Open,
    /// One probe is in flight; other calls skip Redis.
    HalfOpen,
}

/// One global rule's breaker, as
/// [`RateLimitLayer::breakers`](crate::RateLimitLayer::breakers) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerStatus {
    /// The rule's name.
    pub rule: std::sync::Arc<str>,
    /// Closed, open or half-open.
    pub state: BreakerState,
    /// While open: how long until a request probes Redis again.
    pub reopens_in: Option<Duration>,
}
