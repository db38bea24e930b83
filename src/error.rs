//! Errors returned when a layer is built; requests never see these.

use std::fmt;

/// Why a [`Quota`](crate::Quota) can never admit a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit is zero.
    ZeroLimit,
    /// The window is zero.
    ZeroWindow,
    /// The burst is zero.
    ZeroBurst,
    /// `window / limit` is below one nanosecond.
    TooFine,
    /// A UTC offset on a quota that is not a calendar quota.
    OffsetWithoutCalendar,
    /// A calendar quota's UTC offset is a day or more.
    OffsetOutOfRange,
    /// A calendar quota with a burst: calendar windows have none.
    BurstOnCalendar,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroLimit => "the limit is zero",
            Self::ZeroWindow => "the window is zero",
            Self::ZeroBurst => "the burst is zero",
            Self::TooFine => "window / limit is below one nanosecond",
            Self::OffsetWithoutCalendar => {
                "a UTC offset needs a calendar quota (per_day, per_month)"
            }
            Self::OffsetOutOfRange => "the UTC offset is a day or more",
            Self::BurstOnCalendar => "a calendar quota has no burst",
        })
    }
}

impl std::error::Error for QuotaError {}

/// Why a layer could not be built.
///
/// ```
/// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, error::BuildError, key::KeyExtractor};
///
/// let err = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::global(), Quota::per_second(0)))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, BuildError::InvalidQuota { .. }));
/// assert_eq!(err.to_string(), "rule \"api\": invalid quota: the limit is zero");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The layer has no rules.
    NoRules,
    /// Two rules share a name; names label headers and metrics, so they must be unique.
    DuplicateRule(String),
    /// A rule name is empty or not printable ASCII (it is sent in headers).
    InvalidRuleName(String),
    /// A static quota can never admit a request.
    InvalidQuota {
        /// The rule.
        rule: String,
        /// What is wrong.
        error: QuotaError,
    },
    /// A fixed cost is above what the quota can ever admit at once.
    CostAboveCapacity {
        /// The rule.
        rule: String,
        /// The cost per request.
        cost: u32,
        /// The most the quota admits at once.
        capacity: u32,
    },
    /// The algorithm needs a shared counter; local rules run GCRA or token bucket.
    AlgorithmNotLocal {
        /// The rule.
        rule: String,
        /// The algorithm asked for.
        algorithm: crate::Algorithm,
    },
    /// Window algorithms count `limit` per window and have no separate burst.
    BurstNotSupported {
        /// The rule.
        rule: String,
        /// The algorithm asked for.
        algorithm: crate::Algorithm,
    },
    /// A trusted proxy is neither a CIDR nor an IP address.
    InvalidProxy(String),
    /// A setting is out of range.
    InvalidSetting(&'static str),
    /// A key extractor was configured with something it can't use, e.g.
    /// [`KeyExtractor::header`](crate::key::KeyExtractor::header) with an
    /// invalid header name.
    InvalidKey {
        /// The rule or concurrency limit.
        rule: String,
        /// What is wrong.
        error: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRules => f.write_str("a rate-limit layer needs at least one rule"),
            Self::DuplicateRule(r) => write!(f, "two rules are named {r:?}"),
            Self::InvalidRuleName(r) => {
                write!(f, "rule name {r:?} must be non-empty printable ASCII")
            }
            Self::InvalidQuota { rule, error } => {
                write!(f, "rule {rule:?}: invalid quota: {error}")
            }
            Self::CostAboveCapacity {
                rule,
                cost,
                capacity,
            } => write!(
                f,
                "rule {rule:?}: a cost of {cost} is above the {capacity} the quota admits at once"
            ),
            Self::AlgorithmNotLocal { rule, algorithm } => write!(
                f,
                "rule {rule:?}: {algorithm} needs a global (Redis) scope; local rules use gcra or token_bucket"
            ),
            Self::BurstNotSupported { rule, algorithm } => write!(
                f,
                "rule {rule:?}: {algorithm} counts `limit` per window and takes no separate burst"
            ),
            Self::InvalidProxy(p) => write!(f, "trusted proxy {p:?} is not a CIDR or IP address"),
            Self::InvalidSetting(s) => write!(f, "invalid setting: {s}"),
            Self::InvalidKey { rule, error } => write!(f, "rule {rule:?}: {error}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Why a [`Control`](crate::Control) operation failed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, error::ControlError, key::KeyExtractor};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::global(), Quota::per_second(5)))
///     .build().unwrap();
/// let err = layer.control().peek("nope", "k").await.unwrap_err();
/// assert!(matches!(err, ControlError::UnknownRule(ref r) if r == "nope"));
/// # }
/// ```
#[derive(Debug)]
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
    /// Redis failed or did not answer within the rule's timeout.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(crate::backend::redis::RedisBackendError),
    /// Redis did not answer within this long (the rule's patience: its
    /// `redis_timeout` many times over, as a decision's).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
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
