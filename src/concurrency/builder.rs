//! The concurrency layer's builder, validated when the layer is built.

use std::sync::Arc;
use std::time::Duration;

use super::layer::ConcurrencyLimitLayer;
use super::shared::Shared;
use crate::error::BuildError;
use crate::headers::{StaticQuotaMember, Unit};
use crate::key::KeyExtractor;
use crate::key::lookup::{KeyWatch, OnMissingKey};
use crate::rule::valid_name;
use crate::settings::{self, Settings};

/// Configures a [`ConcurrencyLimitLayer`]; [`build`](Self::build) checks everything.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, OnMissingKey, headers::HeaderStyle};
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
///     .retry_after(Duration::from_secs(10))
///     .headers(HeaderStyle::Both)
///     .max_key_len(128)
///     .build()?;
/// # Ok::<(), keyed_rate_limit::BuildError>(())
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
    pub(super) global: super::global_options::SlotOptions,
}

impl ConcurrencyLimitLayer {
    /// Starts a builder for a limit named `name` (it labels headers, logs and
    /// metrics) of `max_in_flight` requests per key found by `key`.
    ///
    /// ```
    /// use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    /// let err = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 0).build();
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
            global: Default::default(),
        }
    }
}

impl ConcurrencyLimitBuilder {
    settings::settings_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::everyone(), 2)"
    );
    settings::legacy_reset_setter!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::everyone(), 2)"
    );

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
    /// a zero `redis_timeout` or failure threshold, or a `slot_ttl` below
    /// 10 ms; see [`BuildError`].
    pub fn build(self) -> Result<ConcurrencyLimitLayer, BuildError> {
        if !valid_name(&self.name) {
            return Err(BuildError::InvalidRuleName(self.name.to_string()));
        }
        BuildError::invalid_if(self.limit == 0, "max_in_flight must be at least 1")?;
        BuildError::invalid_if(self.retry_after.is_zero(), "retry_after must be positive")?;
        self.settings.validate()?;
        OnMissingKey::validate_keys(self.on_missing.as_ref(), &self.key, &self.name)?;
        #[cfg(not(feature = "redis"))]
        let slots = super::slot_store::SlotStore::local();
        #[cfg(feature = "redis")]
        let slots = self.global.slot_store(&self.name, &self.settings)?;
        // Rendered once, and only when `RateLimit-Policy` is sent.
        let quota_member = self.settings.headers.draft().then(|| {
            StaticQuotaMember::new(&self.name, self.limit, self.retry_after, Unit::Concurrent)
        });
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                quota_member: quota_member.flatten(),
                watch: KeyWatch::new(self.name.clone(), &self.key),
                deny_log: Default::default(),
                counted: crate::observe::Counted::new(&self.name),
                name: self.name,
                key: self.key,
                limit: self.limit,
                on_missing: self.on_missing,
                retry_after: self.retry_after,
                max_key_len: self.settings.max_key_len,
                headers: self.settings.headers,
                deny: self.settings.refusals,
                slots,
            }),
        })
    }
}
