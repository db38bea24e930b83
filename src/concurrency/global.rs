//! The concurrency builder's setters for a limit counted in Redis.

use std::time::Duration;

use super::builder::ConcurrencyLimitBuilder;
use crate::backend::redis::RedisBackend;

impl ConcurrencyLimitBuilder {
    crate::settings::failure_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::everyone(), 2)",
        global.failure
    );

    /// Counts in-flight requests in a shared Redis, so all gateway
    /// instances together admit at most `max_in_flight` per key.
    ///
    /// Each admitted request holds a slot: a member of the sorted set
    /// `prefix:{<len>:name:key}:lease` (the suffix of earlier versions, kept) whose score is its expiry on Redis's
    /// clock. The slot is released when the response body ends or is
    /// dropped, renewed every [`slot_ttl`](Self::slot_ttl)` / 3` while it
    /// lives (one task per limit renews every slot this instance holds,
    /// one Redis call per key), and expires on its own after the TTL if
    /// this gateway crashes.
    /// A refusal's `Retry-After` is [`retry_after`](Self::retry_after), or
    /// sooner when the earliest slot expires sooner.
    /// [`in_flight`](super::ConcurrencyLimitLayer::in_flight) then reports this
    /// instance's requests only.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keyed_rate_limit::{RedisBackend, failure::FailureMode};
    /// use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let exports = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
    ///     .global(redis)
    ///     .slot_ttl(Duration::from_secs(10))
    ///     .on_redis_failure(FailureMode::FailClosed)
    ///     .build()?;
    /// # let _ = exports;
    /// # Ok(()) }
    /// ```
    pub fn global(mut self, redis: RedisBackend) -> Self {
        self.global.redis = Some(redis);
        self
    }

    /// How long a slot in Redis lasts without renewal (default 30 s, at
    /// least 10 ms): the longest a crashed gateway's requests keep their
    /// slots. Used by [`global`](Self::global) limits only.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    /// let b = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 2)
    ///     .slot_ttl(Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    pub fn slot_ttl(mut self, ttl: Duration) -> Self {
        self.global.slot_ttl = ttl;
        self
    }
}
