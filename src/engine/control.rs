//! What the control handle does to a key, and why it can fail.

use std::fmt;

/// Why a [`Control`](crate::rate_limit::Control) operation failed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, rate_limit::ControlError};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(5)))
///     .build().unwrap();
/// let err = layer.control().peek("nope", "k").await.unwrap_err();
/// assert!(matches!(err, ControlError::UnknownRule(ref r) if r == "nope"));
/// # }
/// ```
#[non_exhaustive]
pub enum ControlError {
    /// No rule of the layer's current chain has this name.
    UnknownRule(String),
    /// The rule computes its quota per request (`quota_fn`), so there is no
    /// one bucket to read or move; only `block` and `unblock` apply.
    DynamicQuota(String),
    /// A local rule holds `max_keys` locked or counted keys, none of which
    /// could be forgotten: the block was not stored.
    KeySpaceFull(String),
    /// The rule is not [blockable](crate::rule::Rule::blockable) and has
    /// no lockout: it never looks for a lock, so a block would not hold.
    NotBlockable(String),
    /// Redis failed or did not answer within the rule's timeout.
    #[cfg(feature = "redis")]
    Redis(crate::backend::redis::RedisBackendError),
    /// Redis did not answer within this long (the rule's patience: its
    /// `redis_timeout` many times over, as a decision's).
    #[cfg(feature = "redis")]
    Timeout(std::time::Duration),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownRule(r) => write!(f, "no rule named {r:?}"),
            Self::DynamicQuota(r) => write!(
                f,
                "rule {r:?} computes its quota per request: only block and unblock apply"
            ),
            Self::KeySpaceFull(r) => write!(f, "rule {r:?}: no place left to lock another key"),
            Self::NotBlockable(r) => write!(
                f,
                "rule {r:?} is not blockable: set `blockable(true)` or a lockout"
            ),
            #[cfg(feature = "redis")]
            Self::Redis(e) => write!(f, "redis: {e}"),
            #[cfg(feature = "redis")]
            Self::Timeout(d) => write!(f, "redis: no answer within {d:?}"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(e) => Some(e),
            _ => None,
        }
    }
}

crate::util::report::debug_as_display!(ControlError);
