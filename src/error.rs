//! Errors returned when a layer is built; requests never see these.

use std::fmt;

use crate::quota::QuotaError;

/// Why a layer could not be built.
///
/// ```
/// use keyed_rate_limit::{BuildError, KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// let err = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(0)))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, BuildError::InvalidQuota { .. }));
/// assert_eq!(err.to_string(), "rule \"api\": invalid quota: the limit is zero");
/// ```
#[derive(Clone, PartialEq, Eq)]
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
        algorithm: crate::algorithm::Algorithm,
    },
    /// Window algorithms count `limit` per window and have no separate burst.
    BurstNotSupported {
        /// The rule.
        rule: String,
        /// The algorithm asked for.
        algorithm: crate::algorithm::Algorithm,
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
    /// An any-of group's members are apart in the chain, or one cannot be
    /// a member.
    InvalidGroup {
        /// The group.
        group: String,
        /// What is wrong.
        error: &'static str,
    },
    /// An entry of [`Rule::exempt_ips`](crate::Rule::exempt_ips) is neither
    /// a CIDR nor an IP address.
    InvalidExemptIp {
        /// The rule.
        rule: String,
        /// The entry as written.
        cidr: String,
    },
}

impl BuildError {
    /// [`InvalidSetting`](Self::InvalidSetting)`(what)` when `invalid` holds.
    pub(crate) fn invalid_if(invalid: bool, what: &'static str) -> Result<(), Self> {
        if invalid {
            return Err(Self::InvalidSetting(what));
        }
        Ok(())
    }
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
            Self::InvalidGroup { group, error } => write!(f, "any-of group {group:?}: {error}"),
            Self::InvalidExemptIp { rule, cidr } => write!(
                f,
                "rule {rule:?}: exempt_ips entry {cidr:?} is not a CIDR or IP address"
            ),
        }
    }
}

impl std::error::Error for BuildError {}

crate::util::report::debug_as_display!(BuildError);
