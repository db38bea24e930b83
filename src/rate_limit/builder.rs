//! The builder: rules and settings, validated when the layer is built.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::layer::RateLimitLayer;
use super::shared::{Current, Shared};
use crate::engine::{Chain, ChainConfig};
use crate::error::BuildError;
use crate::rule::Rule;
use crate::settings::{self, Settings};

/// Configures a [`RateLimitLayer`]; [`build`](Self::build) checks everything.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, headers::HeaderStyle};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("burst", KeyExtractor::peer_ip(), Quota::per_second(10)))
///     .rule(Rule::new("daily", KeyExtractor::peer_ip(), Quota::new(10_000, Duration::from_secs(86_400))))
///     .headers(HeaderStyle::Both)
///     .max_key_len(256)
///     .build()?;
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[must_use]
#[derive(Debug)]
pub struct RateLimitBuilder {
    rules: Vec<Rule>,
    settings: Settings,
    extension: bool,
    cleanup_every: Duration,
    refunds: bool,
    restore: Vec<crate::snapshot::SavedRule>,
}

impl Default for RateLimitBuilder {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            settings: Settings::default(),
            extension: false,
            cleanup_every: Duration::from_secs(60),
            refunds: true,
            restore: Vec::new(),
        }
    }
}

impl RateLimitLayer {
    /// Starts a builder.
    pub fn builder() -> RateLimitBuilder {
        RateLimitBuilder::default()
    }
}

impl RateLimitBuilder {
    settings::settings_setters!(
        "RateLimitLayer::builder().rule(Rule::new(\"r\", KeyExtractor::everyone(), Quota::per_second(1)))"
    );
    settings::legacy_reset_setter!(
        "RateLimitLayer::builder().rule(Rule::new(\"r\", KeyExtractor::everyone(), Quota::per_second(1)))"
    );

    /// Adds a rule after the ones already added.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Adds several rules, in order.
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// Adds an any-of group after the rules already added: a request is
    /// charged to the first member that admits it; see [`rule::any_of`](crate::rule::any_of).
    pub fn any_of(
        self,
        name: impl Into<Arc<str>>,
        members: impl IntoIterator<Item = Rule>,
    ) -> Self {
        self.rules(crate::rule::any_of(name, members))
    }

    /// Whether allowed requests carry their [`RateLimitDecision`](crate::decision::RateLimitDecision) in the
    /// request extensions for the handler (default `false`). A handler that
    /// reads it turns it on; a layer whose handlers don't pays nothing for
    /// it (it was an allocation and an extension-map insert per request).
    /// The response headers are the same either way. A
    /// [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) inside this
    /// layer adds its own decision to the same extension.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(5)))
    ///     .decision_extension(true)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.extension = on;
        self
    }

    /// Whether a request a later rule refuses (or rejects for a missing
    /// key) gets back the units earlier rules spent on it (default `true`).
    /// Each refund is atomic in its backend: a local adjustment, or one
    /// Redis script call on Redis time, sent without holding up the 429.
    /// Exact for GCRA and the token bucket (never past a whole bucket); the
    /// window algorithms and calendar quotas give units back to the window
    /// current at the refund, so one spent just before a window ended is
    /// mostly dropped (given to the new window only if it has spent some).
    /// A single-rule chain records nothing and pays nothing. Rules that
    /// settle on the response ([`Rule::count_if`], [`Rule::cost_from_response`])
    /// give their reservation back on a refusal whatever this says: a
    /// response that never comes cannot count.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .rule(Rule::new("all", KeyExtractor::everyone(), Quota::per_second(1000)))
    ///     .refunds(false)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn refunds(mut self, on: bool) -> Self {
        self.refunds = on;
        self
    }

    /// Lets requests for which `f` holds past every rule, e.g. health
    /// checks: they spend nothing, get no rate-limit headers, and are
    /// counted once in `rate_limit_decisions_total{rule="*",
    /// outcome="exempt"}` ([`LAYER_RULE`](crate::observe::LAYER_RULE)). The
    /// handler still finds a [`RateLimitDecision`](crate::decision::RateLimitDecision)
    /// (with no rules) when [`decision_extension`](Self::decision_extension)
    /// is on. A reload keeps it. For one rule only, see [`Rule::exempt`].
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-ip", KeyExtractor::peer_ip(), Quota::per_second(10)))
    ///     .exempt(|parts| parts.uri.path() == "/healthz")
    ///     .build()
    ///     .unwrap();
    /// assert!(layer.describe().markdown().starts_with("Exempt from every rule: fn\n"));
    /// ```
    pub fn exempt<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    {
        self.settings.exempt = Some(Arc::new(f));
        self
    }

    /// How often the background task forgets keys whose buckets are full
    /// again (default 60 s). The task starts with the first request on a
    /// Tokio runtime and ends when the layer is dropped.
    pub fn cleanup_interval(mut self, every: Duration) -> Self {
        self.cleanup_every = every;
        self
    }

    /// Loads the counters a [`RateLimitLayer::snapshot`] saved into the
    /// local rules of the same name when the layer is built; the time since
    /// it was written counts as elapsed. See [`snapshot`](crate::snapshot).
    ///
    /// # Errors
    ///
    /// A file that can't be read, isn't a snapshot, is of a later version,
    /// or is corrupt or truncated ([`SnapshotError`](crate::snapshot::SnapshotError)):
    /// nothing of it is loaded.
    pub fn restore(
        mut self,
        r: impl std::io::Read,
    ) -> Result<Self, crate::snapshot::SnapshotError> {
        self.restore = crate::snapshot::read(r)?.0;
        Ok(self)
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// No rules, duplicate or invalid rule names, a static quota that admits
    /// nothing, a fixed cost above the burst, an algorithm the scope cannot
    /// run, or an out-of-range setting; see [`BuildError`].
    pub fn build(self) -> Result<RateLimitLayer, BuildError> {
        self.settings.validate()?;
        BuildError::invalid_if(
            self.cleanup_every.is_zero(),
            "cleanup_interval must be positive",
        )?;
        let config = ChainConfig {
            instances: self.settings.instances,
            max_key_len: self.settings.max_key_len,
            cleanup_every: self.cleanup_every,
            refunds: self.refunds,
        };
        let chain = Chain::compile(self.rules, config, self.settings.headers.draft(), None)?;
        if !self.restore.is_empty() {
            let restored = chain.import(&self.restore);
            tracing::info!(target: crate::observe::TARGET, restored, saved = self.restore.len(), "rate-limit counters restored from a snapshot");
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                chain: Current(RwLock::new(Arc::new(chain))),
                config,
                reloading: Mutex::new(()),
                headers: self.settings.headers,
                deny: self.settings.refusals,
                extension: self.extension,
                exempt: self.settings.exempt,
            }),
        })
    }
}
