//! Defining a rule: [`Rule::new`], [`Rule::computed`] and the setters
//! every rule takes (the exemptions are in `exempt`, the Redis settings in
//! `global`, the getters in `mod.rs`).

use std::sync::Arc;

use http::request::Parts;

use super::{Cost, DEFAULT_MAX_KEYS, DEFAULT_NEAR_LIMIT_RATIO, QuotaSource, Rule, Scope};
use crate::algorithm::Algorithm;
use crate::key::{KeyExtractor, OnMissingKey};
use crate::policy::{FailurePolicy, KeySpaceFull, Lockout, OnDeny, QuotaChange};
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
            partition_key: false,
            split_across_instances: false,
            failure: FailurePolicy::default(),
            max_keys: DEFAULT_MAX_KEYS,
            on_key_space_full: KeySpaceFull::default(),
            lockout: None,
            blockable: false,
            #[cfg(feature = "redis")]
            global: crate::policy::GlobalOptions::default(),
            count_if: None,
            cost_from_response: None,
            group: None,
            on_quota_change: QuotaChange::default(),
            exempt: None,
            near_limit: Some(DEFAULT_NEAR_LIMIT_RATIO),
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
    /// hidden rule carries the visible rules' members only (`r` and `t` of
    /// the rules that allowed), and its problem body names the rule.
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

    /// Locks out keys this rule keeps denying; see [`Lockout`]. Shadow
    /// rules never lock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::Lockout};
    /// let login = Rule::new("login", KeyExtractor::header("x-user"), Quota::per_minute(5))
    ///     .lockout(Lockout::new(5, Duration::from_secs(60), Duration::from_secs(900)));
    /// assert_eq!(login.get_lockout().map(|l| l.after()), Some(5));
    /// ```
    pub fn lockout(mut self, lockout: Lockout) -> Self {
        self.lockout = Some(lockout);
        self
    }

    /// Lets the [control handle](crate::rate_limit::Control::block) block
    /// this rule's keys (default `false`; a rule with a
    /// [`lockout`](Self::lockout) always can). A rule that cannot be
    /// locked never looks for a lock: on a global rule, one Redis read less
    /// per decision. Blocking a key of a rule that is not blockable is
    /// [`ControlError::NotBlockable`](crate::rate_limit::ControlError::NotBlockable).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let api = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(600))
    ///     .blockable(true);
    /// assert!(api.is_blockable());
    /// ```
    pub fn blockable(mut self, blockable: bool) -> Self {
        self.blockable = blockable;
        self
    }

    /// What each key's usage becomes when a reload changes this rule's
    /// static quota (default [`QuotaChange::Proportional`]): the reloaded
    /// rule's setting applies.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::QuotaChange};
    /// // Lowering a limit during an attack keeps what attackers spent.
    /// let r = Rule::new("api", KeyExtractor::peer_ip(), Quota::per_minute(50))
    ///     .on_quota_change(QuotaChange::AsIs);
    /// # let _ = r;
    /// ```
    pub fn on_quota_change(mut self, how: QuotaChange) -> Self {
        self.on_quota_change = how;
        self
    }

    /// Counts an allowed request that leaves less than `ratio` of the
    /// quota's limit remaining in
    /// `rate_limit_decisions_total{outcome="near_limit"}`, and logs it (an
    /// `info` event, at most one a second per rule): a client about to be
    /// refused, seen before it is. On by default at
    /// [`DEFAULT_NEAR_LIMIT_RATIO`] (0.2); `None` turns it off. A ratio
    /// outside (0, 1] is a build error. For a static quota the threshold
    /// is computed once, when the layer is built.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let r = Rule::new("api", KeyExtractor::peer_ip(), Quota::per_minute(100)).near_limit_ratio(Some(0.1));
    /// assert!(RateLimitLayer::builder().rule(r).build().is_ok());
    /// let quiet = Rule::new("api", KeyExtractor::peer_ip(), Quota::per_minute(100)).near_limit_ratio(None);
    /// # let _ = quiet;
    /// let bad = Rule::new("api", KeyExtractor::peer_ip(), Quota::per_minute(100)).near_limit_ratio(Some(1.5));
    /// assert!(RateLimitLayer::builder().rule(bad).build().is_err());
    /// ```
    pub fn near_limit_ratio(mut self, ratio: Option<f64>) -> Self {
        self.near_limit = ratio;
        self
    }

    /// The most keys this rule holds in this process (default
    /// [`DEFAULT_MAX_KEYS`], one million) in each of its stores: its local
    /// counters, and for a global rule its cached denies and, apart, its
    /// fallback shares and Redis's last answer per key (which the fallback
    /// starts from). Memory then
    /// stays under `max_keys` times the bytes a key costs (~100, see
    /// [BENCHMARKS.md](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/BENCHMARKS.md)), whatever a flood of distinct keys does.
    ///
    /// A new key that finds no place first makes room by forgetting full
    /// buckets (which changes no decision; at most ten sweeps a second
    /// while full); if none can go, [`on_key_space_full`](Self::on_key_space_full)
    /// applies. Keys already held keep their own limits throughout. Zero is
    /// a build error.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let per_ip = Rule::new("per-ip", KeyExtractor::peer_ip(), Quota::per_second(5)).max_keys(50_000);
    /// # let _ = per_ip;
    /// ```
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// What a new key gets when the key space is full (default
    /// [`KeySpaceFull::Overflow`]): see [`max_keys`](Self::max_keys).
    pub fn on_key_space_full(mut self, policy: KeySpaceFull) -> Self {
        self.on_key_space_full = policy;
        self
    }

    /// Adds the draft's partition key `pk` to this rule's `RateLimit`
    /// member (default off): an sf-binary of the first 9 bytes of the
    /// SHA-256 of the key, so a client holding several keys can tell its
    /// quotas apart. The raw key is never sent; a low-entropy key (an IP
    /// address) can still be recovered by hashing every candidate, so turn it
    /// on for keys like API keys. `RateLimit-Policy` does not carry it: it
    /// stays the same for every key.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let per_key = Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
    ///     .partition_key(true);
    /// # let _ = per_key;
    /// ```
    pub fn partition_key(mut self, on: bool) -> Self {
        self.partition_key = on;
        self
    }

    /// For a local rule: enforce only this instance's share of the quota,
    /// the quota divided by
    /// [`RateLimitBuilder::instances`](crate::rate_limit::RateLimitBuilder::instances),
    /// so N gateways together admit about the whole quota.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let r = Rule::new("r", KeyExtractor::everyone(), Quota::per_second(90)).split_across_instances(true);
    /// # let _ = r;
    /// ```
    pub fn split_across_instances(mut self, split: bool) -> Self {
        self.split_across_instances = split;
        self
    }

    /// Keeps the units a request spent only when `f` holds for its
    /// response head, e.g. a login rule that counts failed attempts only.
    ///
    /// The units are **reserved** when the request is decided, as for any
    /// rule, and given back when the response head says `f` is false: so a
    /// burst of concurrent requests can never overshoot the quota (an
    /// attacker controls concurrency), and a request that would not count
    /// holds its unit only while it is in flight. A request that never
    /// gets a response head (its client went away once the handler was
    /// called, or the inner service returned `Err`) keeps its reservation:
    /// the handler may have done its work, and a client must not be able to
    /// start work for free by hanging up. So does a panic in `f` (logged as
    /// an error; nothing else is affected). Needs a request cost
    /// of at least 1 (the build checks a fixed one; a `cost_fn` that gives 0
    /// skips the rule, settlement included).
    ///
    /// `f` sees the status and headers the inner service answered with,
    /// before the body. For gRPC that is `grpc-status` only on a
    /// trailers-only response (how tonic answers an error returned before
    /// any message, e.g. from an interceptor or a unary handler); a status
    /// sent in trailers after a streamed body is not seen.
    ///
    /// ```
    /// use http::StatusCode;
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// // Five failed logins a minute per user; successful ones are free.
    /// let login = Rule::new("login", KeyExtractor::header("x-user"), Quota::per_minute(5))
    ///     .count_if(|res| matches!(res.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN));
    /// # let _ = login;
    /// ```
    pub fn count_if<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    {
        self.count_if = Some(Arc::new(f));
        self
    }

    /// Charges what the response says a request cost, e.g. the tokens an
    /// LLM handler reports in a header. The request's cost (`cost` or
    /// `cost_fn`, 1 by default) is reserved when it is decided; when the
    /// response head arrives, the difference is charged or given back. A
    /// charge past the bucket saturates it (the next request waits as after
    /// a full burst), never errors; a denied request is never charged. A
    /// panic in `f` keeps the reservation. With [`count_if`](Self::count_if)
    /// too, a response `count_if` refuses costs nothing.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let tokens = Rule::new("tokens", KeyExtractor::header("x-api-key"), Quota::per_minute(100_000))
    ///     .cost_from_response(|res| {
    ///         res.headers.get("x-tokens-used")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     });
    /// # let _ = tokens;
    /// ```
    pub fn cost_from_response<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost_from_response = Some(Arc::new(f));
        self
    }
}
