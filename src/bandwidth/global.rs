//! The builder methods of a global bandwidth limit: one budget per key
//! across gateways, leased from Redis in blocks of bytes.

use super::builder::BandwidthLimitBuilder;
use crate::backend::redis::RedisBackend;
use crate::rule::LeasePolicy;

impl BandwidthLimitBuilder {
    crate::settings::failure_setters!(
        "keyed_rate_limit::BandwidthLimitLayer::builder(\"dl\", KeyExtractor::everyone(), 65_536)",
        rule.failure
    );

    /// Counts every gateway's bytes in Redis, so a key's rate is shared by
    /// the fleet. Bytes are leased in blocks (see [`lease`](Self::lease)):
    /// Redis is asked when a block is spent, not for every frame.
    ///
    /// ```no_run
    /// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor, RedisBackend};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let layer = BandwidthLimitLayer::builder("downloads", KeyExtractor::header("x-api-key"), 1 << 20)
    ///     .global(redis)
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn global(mut self, redis: RedisBackend) -> Self {
        self.rule = self.rule.global(redis);
        self
    }

    /// How bytes are leased from Redis (default: leases of at most 100 ms,
    /// sized by the key's rate); see [`LeasePolicy`]. The burst must
    /// exceed the bytes one `ttl` brings: those are held back so that the
    /// fleet never moves more than the exact limit would.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor, rule::LeasePolicy};
    /// let b = BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), 1 << 20)
    ///     .lease(LeasePolicy::new(Duration::from_millis(50)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: LeasePolicy) -> Self {
        self.rule = self.rule.lease(lease);
        self
    }
}
