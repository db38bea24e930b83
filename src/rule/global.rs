//! The builder methods of global rules: Redis, its failure mode, leases,
//! coalescing.

use super::{LeasePolicy, Rule, Scope};
use crate::backend::redis::RedisBackend;

impl Rule {
    crate::settings::failure_setters!(
        "Rule::new(\"r\", KeyExtractor::everyone(), Quota::per_second(10))",
        failure
    );

    /// Counts in a shared Redis, so all gateway instances enforce one limit.
    /// Every algorithm is available; decisions use Redis server time.
    ///
    /// ```no_run
    /// use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RedisBackend, Rule};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let rule = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(600))
    ///     .global(redis)
    ///     .algorithm(Algorithm::SlidingWindow);
    /// # Ok(()) }
    /// ```
    pub fn global(mut self, redis: RedisBackend) -> Self {
        self.scope = Scope::Global(redis);
        self
    }

    /// Leases the global quota in blocks instead of asking Redis for every
    /// request: see [`LeasePolicy`] for the sizes and the bound. A request
    /// spent from a lease costs about what a local rule's does and is
    /// decided while Redis is down, until the lease ends; then the
    /// rule's failure mode applies. Only for global rules; not with a
    /// [`lockout`](Self::lockout), whose denies must all reach Redis.
    ///
    /// Under a lease the `RateLimit` headers are an estimate: this
    /// gateway's lease left plus what Redis had free when it was granted.
    /// A static quota that cannot keep the bound under leases (a calendar
    /// quota, or a burst no larger than the units one `ttl` brings) is a
    /// build error; such a quota from [`quota_fn`](Self::quota_fn) is
    /// decided exactly, per request. Beside leases, Redis decides in the
    /// leases' quota (the burst held back), so a request cost above that
    /// burst is refused without `Retry-After`. The
    /// [`Control`](crate::rate_limit::Control) handle acts on Redis and drops this
    /// gateway's lease of the key; other gateways spend what they hold
    /// until their leases end (at most `ttl`), and a blocked key gets no
    /// new lease.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keyed_rate_limit::{KeyExtractor, Quota, RedisBackend, Rule, rule::LeasePolicy};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let rule = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_second(1000))
    ///     .global(redis)
    ///     .lease(LeasePolicy::new(Duration::from_millis(100)));
    /// assert!(rule.get_lease().is_some());
    /// # Ok(()) }
    /// ```
    pub fn lease(mut self, lease: LeasePolicy) -> Self {
        self.global.lease = Some(lease);
        self
    }

    /// Commits a global rule's concurrent requests together (on by
    /// default): while one of the rule's script calls is in flight on this
    /// gateway, later requests, any key, wait for it, and one call then
    /// decides them all (up to 128), each key and cost in arrival order,
    /// exactly as separate calls would (each gets its own decision and
    /// headers). A gateway then costs Redis about one call per round trip
    /// rather than one per request; a request that waits pays up to one
    /// extra round trip, and an idle gateway never waits. On a cluster a
    /// call holds the keys of one slot. `coalesce(false)` makes one call
    /// per request. The exact decisions of several global rules on one
    /// Redis (not a cluster) asked together
    /// ([`KeyedRules::decide_all`](crate::rate_limit::KeyedRules::decide_all),
    /// a rate-limit service's descriptors) are one call already, and
    /// don't queue; a lone one queues as usual.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let rule = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_second(100));
    /// assert!(rule.get_coalesce());
    /// assert!(!rule.coalesce(false).get_coalesce());
    /// ```
    pub fn coalesce(mut self, on: bool) -> Self {
        self.global.coalesce = on;
        self
    }
}
