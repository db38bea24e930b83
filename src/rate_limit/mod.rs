//! The rate-limit middleware: [`RateLimitLayer`], [`RateLimitService`] and
//! their [`ResponseFuture`].

mod chain;
mod future;
#[cfg(feature = "redis")]
mod global;
mod service;

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use tower::Layer;

pub use future::ResponseFuture;
pub use service::RateLimitService;

use crate::error::BuildError;
use crate::gate::Admission;
use crate::headers::Headers;
use crate::response::{Denied, DenyFn, refusal};
use crate::settings::{self, Settings};
use crate::{RateLimitDecision, Rule};
use chain::{Chain, ChainConfig, Verdict};

/// Applies an ordered list of [`Rule`]s to every request.
///
/// Built with [`RateLimitLayer::builder`]; cheap to clone (an `Arc`), and every
/// service it makes shares the same counters.
///
/// ```
/// use axum::{routing::get, Router};
/// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
///
/// let limit = RateLimitLayer::builder()
///     .rule(Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
///     .build()?;
/// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
/// # Ok::<(), keyed_rate_limit::error::BuildError>(())
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) chain: Arc<Chain>,
    headers: Headers,
    deny: Arc<DenyFn>,
    extension: bool,
}

impl Shared {
    /// Turns the chain's verdict into headers and, when allowed, puts the
    /// decision in the extensions for the handler.
    pub(crate) fn conclude(&self, verdict: Verdict, parts: &mut Parts) -> Admission<()> {
        let mut headers = crate::headers::Rendered::new();
        match verdict {
            Verdict::Allow(mut rules) => {
                self.headers.render(&mut rules, &mut headers);
                if self.extension {
                    // Under an outer rate limiter, its decisions come first.
                    if let Some(outer) = parts.extensions.insert(RateLimitDecision { rules }) {
                        if let Some(d) = parts.extensions.get_mut::<RateLimitDecision>() {
                            d.rules.insert_many(0, outer.rules);
                        }
                    }
                }
                Admission::Go(headers, ())
            }
            Verdict::Deny(mut rules) => {
                self.headers.render(&mut rules, &mut headers);
                let last = rules.last().expect("a deny carries its decision");
                let denied = Denied {
                    rule: last.rule.clone(),
                    retry_after: last.decision.retry_after(),
                    status: StatusCode::TOO_MANY_REQUESTS,
                    hidden: last.hidden,
                };
                Admission::Stop(refusal(&*self.deny, &denied, &parts.headers, headers))
            }
            Verdict::Reject {
                rule,
                status,
                mut decisions,
            } => {
                self.headers.render(&mut decisions, &mut headers);
                let denied = Denied {
                    rule,
                    retry_after: None,
                    status,
                    hidden: false,
                };
                Admission::Stop(refusal(&*self.deny, &denied, &parts.headers, headers))
            }
        }
    }
}

impl RateLimitLayer {
    /// Starts a builder.
    pub fn builder() -> RateLimitBuilder {
        RateLimitBuilder::default()
    }

    /// The rules, in evaluation order.
    ///
    /// ```
    /// # use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("a", KeyExtractor::global(), Quota::per_second(1)))
    ///     .build().unwrap();
    /// assert_eq!(layer.rules().map(|r| r.name()).collect::<Vec<_>>(), ["a"]);
    /// ```
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.shared.chain.rules()
    }

    /// What the layer enforces, as a Markdown table or a Mermaid flowchart:
    /// documentation that can't drift from the code.
    ///
    /// ```
    /// # use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .build().unwrap();
    /// println!("{}", layer.describe().markdown());
    /// assert!(layer.describe().mermaid().contains("1. api"));
    /// ```
    pub fn describe(&self) -> crate::describe::Description {
        crate::describe::Description::new(self.rules())
    }

    /// How many keys the local backend holds now, across rules: a gauge
    /// for memory. Keys whose buckets are full again are swept in the
    /// background (see [`RateLimitBuilder::cleanup_interval`]).
    ///
    /// ```
    /// # use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// # let layer = RateLimitLayer::builder()
    /// #     .rule(Rule::new("a", KeyExtractor::global(), Quota::per_second(1))).build().unwrap();
    /// assert_eq!(layer.local_keys(), 0);
    /// ```
    pub fn local_keys(&self) -> usize {
        self.shared.chain.local_keys()
    }

    /// The circuit breaker of each global rule, in rule order, with the time
    /// left until an open one probes Redis again: for health checks and
    /// dashboards.
    ///
    /// ```
    /// # use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// # let layer = RateLimitLayer::builder()
    /// #     .rule(Rule::new("a", KeyExtractor::global(), Quota::per_second(1))).build().unwrap();
    /// assert!(layer.breakers().is_empty(), "local rules have no breaker");
    /// ```
    pub fn breakers(&self) -> Vec<crate::failure::BreakerStatus> {
        self.shared.chain.breakers()
    }

    /// Sweeps keys whose buckets are full again now, instead of waiting for
    /// the background sweep. Dropping them changes no decision.
    pub fn cleanup(&self) {
        self.shared.chain.cleanup();
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, self.shared.clone())
    }
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.rules().collect::<Vec<_>>())
            .field("headers", &self.shared.headers)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RateLimitLayer`]; [`build`](Self::build) checks everything.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{HeaderStyle, Quota, RateLimitLayer, Rule, key::KeyExtractor};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("burst", KeyExtractor::peer_ip(), Quota::per_second(10)))
///     .rule(Rule::new("daily", KeyExtractor::peer_ip(), Quota::new(10_000, Duration::from_secs(86_400))))
///     .headers(HeaderStyle::Both)
///     .max_key_len(256)
///     .build()?;
/// # Ok::<(), keyed_rate_limit::error::BuildError>(())
/// ```
#[must_use]
#[derive(Debug)]
pub struct RateLimitBuilder {
    rules: Vec<Rule>,
    settings: Settings,
    extension: bool,
    cleanup_every: Duration,
}

impl Default for RateLimitBuilder {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            settings: Settings::default(),
            extension: true,
            cleanup_every: Duration::from_secs(60),
        }
    }
}

impl RateLimitBuilder {
    settings::settings_setters!(
        "RateLimitLayer::builder().rule(Rule::new(\"r\", KeyExtractor::global(), Quota::per_second(1)))"
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

    /// Whether allowed requests carry their [`RateLimitDecision`] in the
    /// request extensions for the handler (default `true`). Turning it off
    /// saves an allocation and an extension-map insert per request when no
    /// handler reads it; the response headers are the same either way.
    ///
    /// ```
    /// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::global(), Quota::per_second(5)))
    ///     .decision_extension(false)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.extension = on;
        self
    }

    /// How often the background task forgets keys whose buckets are full
    /// again (default 60 s). The task starts with the first request on a
    /// Tokio runtime and ends when the layer is dropped.
    pub fn cleanup_interval(mut self, every: Duration) -> Self {
        self.cleanup_every = every;
        self
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
        if self.cleanup_every.is_zero() {
            return Err(BuildError::InvalidSetting(
                "cleanup_interval must be positive",
            ));
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                chain: Arc::new(Chain::compile(
                    self.rules,
                    ChainConfig {
                        instances: self.settings.instances,
                        max_key_len: self.settings.max_key_len,
                        cleanup_every: self.cleanup_every,
                    },
                    self.settings.headers.draft(),
                )?),
                headers: self.settings.headers,
                deny: self.settings.deny,
                extension: self.extension,
            }),
        })
    }
}
