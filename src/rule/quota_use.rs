//! How a rule's quota is used beyond one decision: split across
//! instances, carried through a reload that changes it, watched as it runs
//! low ([`Rule::split_across_instances`], [`Rule::on_quota_change`],
//! [`Rule::near_limit_ratio`]).

use super::{QuotaChange, Rule};

/// The share of the quota left below which an allowed request counts as
/// `near_limit` by default: see [`Rule::near_limit_ratio`].
///
/// ```
/// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::DEFAULT_NEAR_LIMIT_RATIO};
/// // Twice as eager as the default.
/// let r = Rule::new("api", KeyExtractor::peer_ip(), Quota::per_minute(100))
///     .near_limit_ratio(Some(DEFAULT_NEAR_LIMIT_RATIO * 2.0));
/// # let _ = r;
/// ```
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.2;

/// How a rule's quota is used beyond one decision: this instance's share
/// of it, what a reload that changes it does to the counters, and the
/// share left below which an allowed request counts as near the limit.
#[derive(Clone, Copy)]
pub(crate) struct QuotaUse {
    pub(crate) split_across_instances: bool,
    pub(crate) on_quota_change: QuotaChange,
    /// `None`: no near-limit signal.
    pub(crate) near_limit: Option<f64>,
}

impl Rule {
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
        self.quota_use.split_across_instances = split;
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
        self.quota_use.on_quota_change = how;
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
        self.quota_use.near_limit = ratio;
        self
    }
}
