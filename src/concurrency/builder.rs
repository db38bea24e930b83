//! The concurrency layer's builder, validated when the layer is built.

use std::sync::Arc;
use std::time::Duration;

use super::backend::Backend;
use super::layer::ConcurrencyLimitLayer;
use super::shared::Shared;
#[cfg(feature = "redis")]
use crate::backend::redis::RedisBackend;
#[cfg(feature = "redis")]
use crate::engine::validate_global;
use crate::error::BuildError;
#[cfg(feature = "redis")]
use crate::failure::Guard;
use crate::headers::StaticPolicy;
use crate::key::KeyExtractor;
#[cfg(feature = "redis")]
use crate::policy::FailurePolicy;
use crate::rule::valid_name;
use crate::rule::{KeyWatch, OnMissingKey};
use crate::settings::{self, Settings};

/// Configures a [`ConcurrencyLimitLayer`]; [`build`](Self::build) checks everything.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use keyed_rate_limit::{HeaderStyle, concurrency::ConcurrencyLimitLayer, key::KeyExtractor, rule::OnMissingKey};
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
///     .retry_after(Duration::from_secs(10))
///     .headers(HeaderStyle::Both)
///     .max_key_len(128)
///     .build()?;
/// # Ok::<(), keyed_rate_limit::error::BuildError>(())
/// ```
#[must_use]
#[derive(Debug)]
pub struct ConcurrencyLimitBuilder {
    name: Arc<str>,
    key: KeyExtractor,
    limit: u32,
    on_missing: Option<OnMissingKey>,
    retry_after: Duration,
    settings: Settings,
    #[cfg(feature = "redis")]
    redis: Option<RedisBackend>,
    #[cfg(feature = "redis")]
    lease_ttl: Duration,
    #[cfg(feature = "redis")]
    failure: FailurePolicy,
}

impl ConcurrencyLimitLayer {
    /// Starts a builder for a limit named `name` (it labels headers, logs and
    /// metrics) of `max_in_flight` requests per key found by `key`.
    ///
    /// ```
    /// use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let err = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 0).build();
    /// assert!(err.is_err(), "a limit of zero admits nothing");
    /// ```
    pub fn builder(
        name: impl Into<Arc<str>>,
        key: KeyExtractor,
        max_in_flight: u32,
    ) -> ConcurrencyLimitBuilder {
        ConcurrencyLimitBuilder {
            name: name.into(),
            key,
            limit: max_in_flight,
            on_missing: None,
            retry_after: Duration::from_secs(1),
            settings: Settings::default(),
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            lease_ttl: Duration::from_secs(30),
            #[cfg(feature = "redis")]
            failure: FailurePolicy::default(),
        }
    }
}

impl ConcurrencyLimitBuilder {
    settings::settings_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::global(), 2)"
    );

    #[cfg(feature = "redis")]
    settings::failure_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::global(), 2)"
    );

    /// Counts in-flight requests in a shared Redis, so all gateway
    /// instances together admit at most `max_in_flight` per key.
    ///
    /// Each admitted request holds a lease: a member of the sorted set
    /// `prefix:{<len>:name:key}:lease` whose score is its expiry on Redis's
    /// clock. The lease is released when the response body ends or is
    /// dropped, renewed every [`lease_ttl`](Self::lease_ttl)` / 3` while it
    /// lives (one task per limit renews every lease this instance holds,
    /// one Redis call per key), and expires on its own after the TTL if
    /// this gateway crashes.
    /// A refusal's `Retry-After` is [`retry_after`](Self::retry_after), or
    /// sooner when the earliest lease expires sooner.
    /// [`in_flight`](ConcurrencyLimitLayer::in_flight) then reports this
    /// instance's requests only.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keyed_rate_limit::{failure::FailureMode, backend::redis::RedisBackend};
    /// use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let exports = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
    ///     .global(redis)
    ///     .lease_ttl(Duration::from_secs(10))
    ///     .on_redis_failure(FailureMode::FailClosed)
    ///     .build()?;
    /// # let _ = exports;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn global(mut self, redis: RedisBackend) -> Self {
        self.redis = Some(redis);
        self
    }

    /// How long a lease in Redis lasts without renewal (default 30 s, at
    /// least 10 ms): the longest a crashed gateway's requests keep their
    /// slots. Used by [`global`](Self::global) limits only.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let b = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 2)
    ///     .lease_ttl(Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// What to do when the key extractor finds no key (default: the limit
    /// does not apply).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.on_missing = Some(policy);
        self
    }

    /// The wait a refused client is told to observe before retrying
    /// (default 1 s): nobody knows when an in-flight request will end, so
    /// this is a hint, sent as `Retry-After` and `grpc-retry-pushback-ms`.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// An invalid name, a limit of zero, a zero `retry_after` or a
    /// `max_key_len` below 64; for a global limit also a name with braces,
    /// a zero `redis_timeout` or failure threshold, or a `lease_ttl` below
    /// 10 ms; see [`BuildError`].
    pub fn build(self) -> Result<ConcurrencyLimitLayer, BuildError> {
        if !valid_name(&self.name) {
            return Err(BuildError::InvalidRuleName(self.name.to_string()));
        }
        if self.limit == 0 {
            return Err(BuildError::InvalidSetting(
                "max_in_flight must be at least 1",
            ));
        }
        if self.retry_after.is_zero() {
            return Err(BuildError::InvalidSetting("retry_after must be positive"));
        }
        self.settings.validate()?;
        OnMissingKey::check_keys(self.on_missing.as_ref(), &self.key, &self.name)?;
        #[cfg(not(feature = "redis"))]
        let backend = Backend::local();
        #[cfg(feature = "redis")]
        let backend = match self.redis {
            None => Backend::local(),
            Some(redis) => {
                validate_global(&self.name, &self.failure, &redis, self.settings.instances)?;
                if self.lease_ttl < Duration::from_millis(10) {
                    return Err(BuildError::InvalidSetting(
                        "lease_ttl must be at least 10 ms",
                    ));
                }
                // The fallback is the local backend's own count, not the
                // guard's rate store.
                let live = redis.live_count();
                Backend::redis(
                    redis,
                    Guard::new(
                        self.name.clone(),
                        self.failure,
                        self.settings.instances(),
                        live,
                    ),
                    self.lease_ttl,
                )
            }
        };
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                // Rendered once, and only when `RateLimit-Policy` is sent.
                policy: self
                    .settings
                    .headers
                    .draft()
                    .then(|| StaticPolicy::new(&self.name, self.limit, self.retry_after, true))
                    .flatten(),
                watch: KeyWatch::new(self.name.clone(), &self.key),
                deny_log: Default::default(),
                name: self.name,
                key: self.key,
                limit: self.limit,
                on_missing: self.on_missing,
                retry_after: self.retry_after,
                max_key_len: self.settings.max_key_len,
                headers: self.settings.headers,
                deny: self.settings.refusals,
                backend,
            }),
        })
    }
}
