#![doc = include_str!("../../docs/rate_limit.md")]

pub(crate) mod chain;
#[cfg(feature = "redis")]
mod coalesce;
mod control;
mod future;
#[cfg(feature = "redis")]
mod global;
mod service;

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use tower::Layer;

pub use control::Control;
pub use future::ResponseFuture;
pub use service::RateLimitService;

use crate::error::BuildError;
use crate::gate::{Admission, Pending};
use crate::headers::Headers;
use crate::response::{Denied, DenyFn, refusal};
use crate::settings::{self, Settings};
use crate::{RateLimitDecision, Rule};
use chain::{Chain, ChainConfig, Settlement, Suspended, Verdict};

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
    /// Swapped whole by [`RateLimitLayer::reload`].
    pub(crate) chain: Current,
    config: ChainConfig,
    /// One reload at a time: each carries state over from the chain it replaces.
    reloading: Mutex<()>,
    headers: Headers,
    deny: Arc<DenyFn>,
    extension: bool,
}

/// The chain requests are decided by. A read lock, not a lock-free swap
/// (`arc-swap`): it is held only while a request is decided without
/// awaiting (an evaluation that awaits takes its own `Arc`), costs two
/// atomic operations, and keeps the dependency tree as small as
/// tower_governor's.
pub(crate) struct Current(RwLock<Arc<Chain>>);

impl Current {
    /// Runs `f` on the current chain.
    fn with<T>(&self, f: impl FnOnce(&Arc<Chain>) -> T) -> T {
        f(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn load(&self) -> Arc<Chain> {
        self.with(Arc::clone)
    }

    /// Swaps in `new`; the old chain is dropped outside the lock.
    fn store(&self, new: Arc<Chain>) {
        let old = std::mem::replace(
            &mut *self.0.write().unwrap_or_else(PoisonError::into_inner),
            new,
        );
        drop(old);
    }
}

impl Shared {
    /// Decides on `parts` with the current chain, unless a step has to
    /// await. Not generic over the service, so it is compiled once and
    /// keeps the services' `call` small.
    pub(crate) fn decide(
        &self,
        parts: &mut Parts,
    ) -> Result<Admission<Option<Box<Settlement>>>, Box<Suspended>> {
        // One chain for the whole request, even if a reload lands meanwhile.
        let verdict = self.chain.with(|chain| chain.evaluate(parts))?;
        Ok(self.conclude(verdict, parts))
    }

    /// The rest of a decision that had to await, on the chain it began on.
    pub(crate) fn finish(
        self: Arc<Self>,
        mut parts: Parts,
        suspended: Box<Suspended>,
    ) -> Pending<Option<Box<Settlement>>> {
        Box::pin(async move {
            let verdict;
            (parts, verdict) = suspended.resume(parts).await;
            let admission = self.conclude(verdict, &mut parts);
            (parts, admission)
        })
    }

    /// Turns the chain's verdict into headers and, when allowed, puts the
    /// decision in the extensions for the handler.
    pub(crate) fn conclude(
        &self,
        verdict: Verdict,
        parts: &mut Parts,
    ) -> Admission<Option<Box<Settlement>>> {
        let mut headers = crate::headers::Rendered::new();
        match verdict {
            Verdict::Allow(mut rules, settle) => {
                self.headers.render(&mut rules, &mut headers);
                if self.extension {
                    // Under an outer rate limiter, its decisions come first.
                    if let Some(outer) = parts.extensions.insert(RateLimitDecision { rules }) {
                        if let Some(d) = parts.extensions.get_mut::<RateLimitDecision>() {
                            d.rules.insert_many(0, outer.rules);
                        }
                    }
                }
                Admission::Go(headers, settle)
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

    /// The rules, in evaluation order: those of the last
    /// [`reload`](Self::reload), if any.
    ///
    /// ```
    /// # use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("a", KeyExtractor::global(), Quota::per_second(1)))
    ///     .build().unwrap();
    /// assert_eq!(layer.rules().iter().map(|r| r.name()).collect::<Vec<_>>(), ["a"]);
    /// ```
    pub fn rules(&self) -> Vec<Rule> {
        self.shared.chain.load().rules().cloned().collect()
    }

    /// The operator's handle on this layer's counters; see [`Control`].
    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Replaces every rule at once, checked as
    /// [`build`](RateLimitBuilder::build) checks them; the layer's other
    /// settings stay. Each request is decided wholly by the rules it
    /// started with, old or new, never a mix; requests already waiting
    /// (`OnDeny::Wait`, Redis) finish on the old ones.
    ///
    /// A rule whose name, key, quota (static, or still a `quota_fn`),
    /// algorithm, scope and key-space settings (`max_keys`,
    /// `on_key_space_full`) are unchanged (for global rules, also its Redis
    /// backend and failure policy) keeps its counters, its cached denies and
    /// its circuit breaker, so a reload hands nobody a fresh quota. Any other rule starts whole: locally with
    /// new counters, globally reading the same Redis keys under its new
    /// quota. On an error the running rules stay.
    ///
    /// ```
    /// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .build()?;
    /// layer.reload([Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(500))])?;
    /// assert_eq!(layer.rules()[0].static_quota(), Some(Quota::per_minute(500)));
    /// assert!(layer.reload([Rule::new("api", KeyExtractor::global(), Quota::per_second(0))]).is_err());
    /// assert_eq!(layer.rules()[0].static_quota(), Some(Quota::per_minute(500)), "unchanged");
    /// # Ok::<(), keyed_rate_limit::error::BuildError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimitBuilder::build`] for the rules; see [`BuildError`].
    pub fn reload(&self, rules: impl IntoIterator<Item = Rule>) -> Result<(), BuildError> {
        let shared = &*self.shared;
        let _one = shared
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = shared.chain.load();
        let new = Chain::compile(
            rules.into_iter().collect(),
            shared.config,
            shared.headers.draft(),
            Some(&old),
        )?;
        let kept = new.kept_from(&old);
        let count = new.rules().count();
        shared.chain.store(Arc::new(new));
        tracing::info!(target: crate::observe::TARGET, rules = count, kept, "rate-limit rules reloaded");
        Ok(())
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
        crate::describe::Description::new(self.shared.chain.load().rules())
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
        self.shared.chain.load().local_keys()
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
        self.shared.chain.load().breakers()
    }

    /// Sweeps keys whose buckets are full again now, instead of waiting for
    /// the background sweep. Dropping them changes no decision.
    pub fn cleanup(&self) {
        self.shared.chain.load().cleanup();
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
            .field("rules", &self.rules())
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
    refunds: bool,
}

impl Default for RateLimitBuilder {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            settings: Settings::default(),
            extension: true,
            cleanup_every: Duration::from_secs(60),
            refunds: true,
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
    /// use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .rule(Rule::new("all", KeyExtractor::global(), Quota::per_second(1000)))
    ///     .refunds(false)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn refunds(mut self, on: bool) -> Self {
        self.refunds = on;
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
        let config = ChainConfig {
            instances: self.settings.instances,
            max_key_len: self.settings.max_key_len,
            cleanup_every: self.cleanup_every,
            refunds: self.refunds,
        };
        let chain = Chain::compile(self.rules, config, self.settings.headers.draft(), None)?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                chain: Current(RwLock::new(Arc::new(chain))),
                config,
                reloading: Mutex::new(()),
                headers: self.settings.headers,
                deny: self.settings.deny,
                extension: self.extension,
            }),
        })
    }
}
