//! Defining a rule: [`Rule::new`], [`Rule::computed`] and the setters
//! every rule takes. The other setters live with their concern, one module
//! each: `accounting`, `exempt`, `global` (Redis), `key_space`,
//! `lock_policy` and `quota_use`; the getters are in `mod.rs`.

use std::sync::Arc;

use http::request::Parts;

use super::key_space::{DEFAULT_MAX_KEYS, KeySpace};
use super::quota_use::{DEFAULT_NEAR_LIMIT_RATIO, QuotaUse};
use super::{Cost, QuotaSource, Rule, Scope};
use crate::algorithm::Algorithm;
use crate::key::{KeyExtractor, OnMissingKey};
use crate::policy::{FailurePolicy, KeySpaceFull, OnDeny, QuotaChange};
use crate::quota::Quota;

impl Rule {
    /// A local GCRA rule with a cost of one per request.
    pub fn new(name: impl Into<Arc<str>>, key: KeyExtractor, quota: Quota) -> Self {
        Self {
            name: name.into(),
            key,
            quota: QuotaSource::Static(quota),
            cost: Cost::Fixed(1),
            algorithm: Algorithm::default(),
            scope: Scope::default(),
            on_missing: None,
            on_deny: OnDeny::default(),
            shadow: false,
            hidden: false,
            group: None,
            exempt: None,
            failure: FailurePolicy::default(),
            #[cfg(feature = "redis")]
            global: crate::policy::GlobalOptions::default(),
            accounting: Default::default(),
            lock_policy: Default::default(),
            key_space: KeySpace {
                max_keys: DEFAULT_MAX_KEYS,
                on_key_space_full: KeySpaceFull::default(),
                partition_key: false,
            },
            quota_use: QuotaUse {
                split_across_instances: false,
                on_quota_change: QuotaChange::default(),
                near_limit: Some(DEFAULT_NEAR_LIMIT_RATIO),
            },
        }
    }

    /// A local GCRA rule whose quota `f` computes per request, as
    /// [`quota_fn`](Self::quota_fn) sets it: the way to write such a rule
    /// without a static quota that would go unused.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    ///
    /// #[derive(Clone, Copy)]
    /// enum Plan { Free, Pro }
    ///
    /// let rule = Rule::computed("plan", KeyExtractor::header("x-api-key"), |parts| {
    ///     match parts.extensions.get::<Plan>() {
    ///         Some(Plan::Pro) => Quota::per_minute(1000),
    ///         _ => Quota::per_minute(100),
    ///     }
    /// });
    /// assert!(rule.static_quota().is_none());
    /// ```
    pub fn computed<F>(name: impl Into<Arc<str>>, key: KeyExtractor, f: F) -> Self
    where
        F: Fn(&Parts) -> Quota + Send + Sync + 'static,
    {
        // The static quota is replaced at once; any valid one will do.
        Self::new(name, key, Quota::per_second(1)).quota_fn(f)
    }

    /// Computes the quota per request, e.g. from a plan an auth layer put in
    /// the extensions; it replaces the quota given to [`new`](Self::new)
    /// ([`computed`](Self::computed) needs none). Such quotas are checked at
    /// request time: one that can never admit anything gives a 429 without
    /// `Retry-After` and a warning. Each distinct quota keeps its own
    /// counters, so a key that changes plan starts afresh.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    ///
    /// #[derive(Clone, Copy)]
    /// enum Plan { Free, Pro }
    ///
    /// let rule = Rule::new("plan", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
    ///     .quota_fn(|parts| match parts.extensions.get::<Plan>() {
    ///         Some(Plan::Pro) => Quota::per_minute(1000),
    ///         _ => Quota::per_minute(100),
    ///     });
    /// # let _ = rule;
    /// ```
    pub fn quota_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Quota + Send + Sync + 'static,
    {
        self.quota = QuotaSource::Dynamic(Arc::new(f));
        self
    }

    /// Every request costs `cost` units. A cost of zero makes the rule free:
    /// it is skipped.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let rule = Rule::new("uploads", KeyExtractor::everyone(), Quota::per_second(100)).cost(5);
    /// # let _ = rule;
    /// ```
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// Computes each request's cost. A cost above what the quota admits at
    /// once gives a 429 without `Retry-After`, since waiting would not help.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let by_size = Rule::new("bytes", KeyExtractor::everyone(), Quota::per_second(1 << 20))
    ///     .cost_fn(|parts| {
    ///         parts.headers.get("content-length")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     });
    /// # let _ = by_size;
    /// ```
    pub fn cost_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Cost::Dynamic(Arc::new(f));
        self
    }

    /// The counting algorithm (default [`Algorithm::Gcra`]).
    ///
    /// ```
    /// # use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, Rule};
    /// let r = Rule::new("r", KeyExtractor::everyone(), Quota::per_second(1)).algorithm(Algorithm::TokenBucket);
    /// # let _ = r;
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// What to do when the key extractor finds no key. By default the rule
    /// is skipped, unless the key's source is missing from the setup (see
    /// [`OnMissingKey`]): then the request is refused with 500 and logged.
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.on_missing = Some(policy);
        self
    }

    /// What to do with a request over the quota (default [`OnDeny::Refuse`]).
    pub fn on_deny(mut self, on_deny: OnDeny) -> Self {
        self.on_deny = on_deny;
        self
    }

    /// Evaluates and records, but never enforces: a would-be deny is logged
    /// and counted in metrics (`outcome="shadow_deny"`) and the request goes
    /// on. For dark-launching a new limit.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let trial = Rule::new("new-limit", KeyExtractor::peer_ip(), Quota::per_second(1)).shadow(true);
    /// # let _ = trial;
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Hides the rule from `RateLimit-Policy`/`RateLimit` (and the legacy
    /// headers) (default `false`: shown). A hidden rule still denies, and its
    /// 429 still carries `Retry-After`, but clients never see its quota or
    /// what is left of it: for abuse and security limits. A 429 from a
    /// hidden rule carries no rate-limit member (neither its own nor the
    /// rules' before it), and its problem body does not name the rule.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let guard = Rule::new("login-abuse", KeyExtractor::peer_ip(), Quota::per_minute(20)).hidden(true);
    /// # let _ = guard;
    /// ```
    pub fn hidden(mut self, hidden: bool) -> Self {
        self.hidden = hidden;
        self
    }
}
