//! Rules: what is limited, by whom and how.
//!
#![doc = include_str!("../../docs/rule.md")]

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "redis")]
pub use crate::policy::LeasePolicy;
pub use crate::policy::{KeySpaceFull, Lockout, OnDeny, QuotaChange};
pub(crate) use accounting::Accounting;
pub use any_of::any_of;
pub(crate) use exempt::Exempt;
pub use key_space::DEFAULT_MAX_KEYS;
pub(crate) use key_space::KeySpace;
pub(crate) use lock_policy::LockPolicy;
pub use quota_use::DEFAULT_NEAR_LIMIT_RATIO;
pub(crate) use quota_use::QuotaUse;

mod any_of;
mod define;

use http::request::Parts;

use crate::algorithm::Algorithm;
#[cfg(feature = "redis")]
use crate::backend::redis::RedisBackend;
use crate::key::{KeyExtractor, OnMissingKey};
use crate::policy::FailurePolicy;
use crate::quota::Quota;

pub(crate) type QuotaFn = dyn Fn(&Parts) -> Quota + Send + Sync;
pub(crate) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// Where a rule's quota comes from.
#[derive(Clone)]
pub(crate) enum QuotaSource {
    Static(Quota),
    /// Computed per request, e.g. from the caller's plan.
    Dynamic(Arc<QuotaFn>),
}

#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u32),
    Dynamic(Arc<CostFn>),
}

/// Where a rule's counters live.
#[derive(Clone, Debug, Default)]
pub(crate) enum Scope {
    /// In this process, with `governor`: fast, but each gateway instance
    /// counts on its own.
    #[default]
    Local,
    /// In a shared Redis: every gateway instance sees the same counters.
    /// See [`Rule::global`].
    #[cfg(feature = "redis")]
    Global(RedisBackend),
}

impl Scope {
    /// `local` or `global`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Local => "local",
            #[cfg(feature = "redis")]
            Self::Global(_) => "global",
        }
    }

    /// Whether the counters live in Redis.
    pub(crate) fn is_global(&self) -> bool {
        !matches!(self, Self::Local)
    }
}

/// One limit: a name, a key, a quota, a cost, an algorithm and a scope.
///
/// Rules are checked when the layer is built
/// ([`RateLimitBuilder::build`](crate::rate_limit::RateLimitBuilder::build)).
///
/// ```
/// use http::StatusCode;
/// use keyed_rate_limit::{KeyExtractor, OnMissingKey, Quota, Rule};
///
/// let rule = Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
///     // Exports cost ten units.
///     .cost_fn(|parts| if parts.uri.path().starts_with("/export") { 10 } else { 1 });
/// assert_eq!(rule.name(), "per-key");
/// ```
#[derive(Clone)]
#[must_use = "a rule does nothing until a layer is built with it"]
pub struct Rule {
    pub(crate) name: Arc<str>,
    pub(crate) key: KeyExtractor,
    pub(crate) quota: QuotaSource,
    pub(crate) cost: Cost,
    pub(crate) algorithm: Algorithm,
    pub(crate) scope: Scope,
    /// `None`: skip a missing key, refuse a missing key source.
    pub(crate) on_missing: Option<OnMissingKey>,
    pub(crate) on_deny: OnDeny,
    pub(crate) shadow: bool,
    pub(crate) hidden: bool,
    /// The any-of group the rule is a member of; see [`any_of`].
    pub(crate) group: Option<Arc<str>>,
    pub(crate) exempt: Option<Box<Exempt>>,
    pub(crate) failure: FailurePolicy,
    #[cfg(feature = "redis")]
    pub(crate) global: crate::policy::GlobalOptions,
    // The other settings, one value per concern, each with its setters in
    // its own module (docs/adr/0034): a new setting joins its concern's
    // value, or is a new concern (a new value and module).
    pub(crate) accounting: Accounting,
    pub(crate) lock_policy: LockPolicy,
    pub(crate) key_space: KeySpace,
    pub(crate) quota_use: QuotaUse,
}

mod accounting;
mod exempt;
#[cfg(feature = "redis")]
mod global;
mod key_space;
mod lock_policy;
mod quota_use;

/// Getters, named after their setters: where a setter holds the name, its
/// getter is the name with `get_` (`get_lockout()` reads what
/// `lockout(..)` set), as `std::process::Command::get_current_dir` reads
/// `current_dir`; a getter with no setter of its name is plain (`name()`,
/// `key()`, `static_quota()`).
impl Rule {
    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key extractor.
    pub fn key(&self) -> &KeyExtractor {
        &self.key
    }

    /// The [`any_of`] group the rule is a member of.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// The static quota, or `None` when it is computed per request.
    pub fn static_quota(&self) -> Option<Quota> {
        match self.quota {
            QuotaSource::Static(q) => Some(q),
            QuotaSource::Dynamic(_) => None,
        }
    }

    /// The rule's lockout, if it has one.
    pub fn get_lockout(&self) -> Option<Lockout> {
        self.lock_policy.lockout
    }

    /// Whether the control handle may block the rule's keys: it is
    /// [blockable](Self::blockable) or has a [lockout](Self::lockout).
    pub fn is_blockable(&self) -> bool {
        self.lock_policy.blockable || self.lock_policy.lockout.is_some()
    }

    /// What a reload that changes the quota does to the counters.
    pub fn get_on_quota_change(&self) -> QuotaChange {
        self.quota_use.on_quota_change
    }

    /// The lockout the rule's denies count toward: none on a shadow rule.
    pub(crate) fn counted_lockout(&self) -> Option<Lockout> {
        self.lock_policy.lockout.filter(|_| !self.shadow)
    }

    /// Whether the rule settles its units on the response.
    pub(crate) fn settles(&self) -> bool {
        self.accounting.count_if.is_some() || self.accounting.cost_from_response.is_some()
    }

    /// Whether the rule commits its concurrent requests together (see
    /// [`coalesce`](Self::coalesce)).
    #[cfg(feature = "redis")]
    pub fn get_coalesce(&self) -> bool {
        self.global.coalesce
    }

    /// The rule's lease policy, if it leases (see [`lease`](Self::lease)).
    #[cfg(feature = "redis")]
    pub fn get_lease(&self) -> Option<LeasePolicy> {
        self.global.lease
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("quota", &self.static_quota())
            .field("algorithm", &self.algorithm)
            .field("scope", &self.scope)
            .field("shadow", &self.shadow)
            .field("failure", &self.failure)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Names are sent in headers: non-empty printable ASCII.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}
