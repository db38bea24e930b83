//! The settings the rate-limit, concurrency and bandwidth builders share:
//! each one's default, check and setter documentation is written once, here.

use std::sync::Arc;

use crate::error::BuildError;
use crate::headers::Headers;
use crate::response::{Refusals, problem_json};

/// `RateLimitBuilder::exempt`.
pub(crate) type ExemptFn = dyn Fn(&http::request::Parts) -> bool + Send + Sync;

/// What the three builders configure.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) max_key_len: usize,
    /// `None` until `instances(n)`: one instance, and a build-time warning
    /// for local fallbacks that would each admit the whole quota.
    pub(crate) instances: Option<u32>,
    pub(crate) headers: Headers,
    pub(crate) refusals: Refusals,
    /// Requests no rule sees (health checks); only the rate-limit builder
    /// sets it. `None`: one check per request.
    pub(crate) exempt: Option<Arc<ExemptFn>>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_key_len: crate::key::DEFAULT_MAX_KEY_LEN,
            instances: None,
            headers: Headers::default(),
            refusals: Refusals {
                body: Arc::new(problem_json),
                grpc_message: None,
            },
            exempt: None,
        }
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("max_key_len", &self.max_key_len)
            .field("instances", &self.instances)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl Settings {
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        BuildError::invalid_if(
            self.max_key_len < crate::key::MIN_MAX_KEY_LEN,
            "max_key_len must be at least 64 bytes (a hex SHA-256)",
        )?;
        BuildError::invalid_if(self.instances == Some(0), "instances must be at least 1")
    }

    /// The instance count to divide by.
    #[cfg(feature = "redis")]
    pub(crate) fn instances(&self) -> u32 {
        self.instances.unwrap_or(1)
    }
}

/// The shared setters, on a builder with a `settings: Settings` field.
/// `$builder` is an expression that makes one, for the doc examples.
macro_rules! settings_setters {
    ($builder:literal) => {
        /// How many gateway instances share the traffic (default 1). What is
        /// divided across instances is divided by this: rate rules with
        /// [`Rule::split_across_instances`](crate::Rule::split_across_instances),
        /// and the local fallback a global limit takes while Redis is down
        /// ([`FailureMode::LocalFallback`](crate::failure::FailureMode::LocalFallback)),
        /// until the backend's live gateway count (on by default,
        /// `RedisBackendBuilder::live_instances`, feature `redis`) has read
        /// one, and never by less afterwards.
        /// A global limit with that fallback logs a warning at build time
        /// when this was never set and its backend keeps no live count:
        /// every gateway would fall back to the whole quota. 0 is a build
        /// error.
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
        #[doc = concat!("let b = ", $builder, ".instances(4);")]
        /// # let _ = b;
        /// ```
        pub fn instances(mut self, n: u32) -> Self {
            self.settings.instances = Some(n);
            self
        }

        /// Longest key kept as is (default
        /// [`DEFAULT_MAX_KEY_LEN`](crate::key::DEFAULT_MAX_KEY_LEN), 256 bytes;
        /// at least 64, so that a hashed key's 64 hex digits fit).
        /// Longer keys are replaced by their SHA-256, locally and in Redis
        /// alike, so a client can't grow memory with huge keys.
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
        #[doc = concat!("assert!(", $builder, ".max_key_len(128).build().is_ok());")]
        #[doc = concat!("assert!(", $builder, ".max_key_len(16).build().is_err());")]
        /// ```
        pub fn max_key_len(mut self, bytes: usize) -> Self {
            self.settings.max_key_len = bytes;
            self
        }

        /// Which rate-limit headers to send (default [`HeaderStyle::Draft`](crate::headers::HeaderStyle::Draft)).
        /// A bandwidth layer sends only the draft's `RateLimit-Policy`
        /// (see [`BandwidthLimitBuilder`](crate::bandwidth::BandwidthLimitBuilder)).
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule, headers::HeaderStyle};
        #[doc = concat!("let b = ", $builder, ".headers(HeaderStyle::Legacy);")]
        /// # let _ = b;
        /// ```
        pub fn headers(mut self, style: crate::headers::HeaderStyle) -> Self {
            self.settings.headers.style = style;
            self
        }

        /// Builds HTTP refusals (default:
        /// [`problem_json`](crate::response::problem_json)) from anything
        /// axum can answer with: a `String`, `Json`, `(StatusCode, String)`,
        /// a `Response`.
        ///
        /// **The status is the layer's**: 429, the status of an
        /// [`OnMissingKey::Reject`](crate::key::OnMissingKey::Reject), or
        /// 500 for a rule that cannot find its key
        /// ([`Denied::status`](crate::response::Denied::status)), whatever
        /// the closure returns. The closure's body and headers are kept; the
        /// layer adds `Retry-After`, the rate-limit headers and, on a 401
        /// without one, a `WWW-Authenticate` challenge (set your own to name
        /// a realm or a scope). The body must
        /// be ready at once (any body axum builds from a value is): a
        /// streaming body is replaced by an empty one and logged. gRPC
        /// requests always get the gRPC-shaped answer (see
        /// [`grpc_message`](Self::grpc_message)).
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
        /// use axum::http::StatusCode;
        #[doc = concat!("let layer = ", $builder)]
        ///     .deny_response(|denied| {
        ///         let wait = denied.retry_after_secs().unwrap_or(0);
        ///         (StatusCode::TOO_MANY_REQUESTS, format!("slow down: retry in {wait} s"))
        ///     })
        ///     .build()
        ///     .unwrap();
        /// # let _ = layer;
        /// ```
        pub fn deny_response<F, R>(mut self, f: F) -> Self
        where
            F: Fn(&crate::response::Denied) -> R + Send + Sync + 'static,
            R: axum::response::IntoResponse,
        {
            self.settings.refusals.body =
                std::sync::Arc::new(move |d: &crate::response::Denied| {
                    crate::response::ready(f(d).into_response())
                });
            self
        }

        /// The `grpc-message` of gRPC refusals (default: the words of the
        /// HTTP body's `detail`, e.g. `rate limit "api" exceeded; retry in
        /// 2 s`, and `rate limit a …` for a hidden rule). Percent-encoded
        /// as gRPC asks; the code stays `RESOURCE_EXHAUSTED` (or the one
        /// matching a rejection's status) and `grpc-retry-pushback-ms` the
        /// wait.
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
        #[doc = concat!("let layer = ", $builder)]
        ///     .grpc_message(|denied| format!("too many calls; retry in {:?}", denied.retry_after()))
        ///     .build()
        ///     .unwrap();
        /// # let _ = layer;
        /// ```
        pub fn grpc_message<F>(mut self, f: F) -> Self
        where
            F: Fn(&crate::response::Denied) -> String + Send + Sync + 'static,
        {
            self.settings.refusals.grpc_message = Some(std::sync::Arc::new(f));
            self
        }
    };
}

#[cfg(feature = "redis")]
/// The Redis failure setters, on a type whose `$($field).+` is its
/// `FailurePolicy`. `$value` makes one, for the doc examples.
macro_rules! failure_setters {
    ($value:literal, $($field:ident).+) => {
        /// What a global limit decides when Redis fails (default
        /// [`FailureMode::LocalFallback`](crate::failure::FailureMode::LocalFallback):
        /// this gateway's share: the quota divided by the live gateway count
        /// its Redis backend keeps, never by less than
        /// [`instances`](crate::rate_limit::RateLimitBuilder::instances),
        /// and by `instances` when the backend keeps no live count); see
        /// [`failure`](crate::failure).
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, Rule, failure::FailureMode};
        #[doc = concat!("let b = ", $value, ".on_redis_failure(FailureMode::FailClosed);")]
        /// # let _ = b;
        /// ```
        pub fn on_redis_failure(mut self, mode: crate::policy::FailureMode) -> Self {
            self.$($field).+.mode = mode;
            self
        }

        /// How long a call to Redis may hear nothing before it fails and the
        /// failure mode decides (default 20 ms, must be positive). A call
        /// whose reply is late while the server keeps answering others (a
        /// busy gateway) keeps waiting, up to 50 timeouts; see
        /// [`failure`](crate::failure).
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, Rule};
        #[doc = concat!("let b = ", $value, ".redis_timeout(Duration::from_millis(50));")]
        /// # let _ = b;
        /// ```
        pub fn redis_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.$($field).+.timeout = timeout;
            self
        }

        /// The circuit breaker in front of Redis (default: open after 5
        /// consecutive failures, probe after 1 s; a refused connection
        /// opens it at once).
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, Rule};
        /// use keyed_rate_limit::failure::BreakerConfig;
        #[doc = concat!("let b = ", $value, ".circuit_breaker(BreakerConfig::default().failure_threshold(3));")]
        /// # let _ = b;
        /// ```
        pub fn circuit_breaker(mut self, breaker: crate::failure::BreakerConfig) -> Self {
            self.$($field).+.breaker = breaker;
            self
        }
    };
}

/// `legacy_reset`, on the builders whose layers send legacy headers (a
/// bandwidth layer sends none).
macro_rules! legacy_reset_setter {
    ($builder:literal) => {
        /// What `X-RateLimit-Reset` counts in the legacy styles (default
        /// [`ResetFormat::DeltaSeconds`](crate::headers::ResetFormat::DeltaSeconds);
        /// `UnixSeconds` is GitHub's and express-rate-limit's convention).
        ///
        /// ```
        /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule, headers::{HeaderStyle, ResetFormat}};
        #[doc = concat!("let b = ", $builder, ".headers(HeaderStyle::Legacy).legacy_reset(ResetFormat::UnixSeconds);")]
        /// # let _ = b;
        /// ```
        pub fn legacy_reset(mut self, format: crate::headers::ResetFormat) -> Self {
            self.settings.headers.reset = format;
            self
        }
    };
}

#[cfg(feature = "redis")]
pub(crate) use failure_setters;
pub(crate) use legacy_reset_setter;
pub(crate) use settings_setters;
