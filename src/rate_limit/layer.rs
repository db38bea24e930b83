//! The layer: its services share one chain, which `reload` swaps.

use std::sync::Arc;
#[cfg(feature = "config")]
use std::sync::Weak;

use tower::Layer;

use super::control::Control;
use super::keyed::KeyedRules;
use super::service::RateLimitService;
use super::shared::Shared;
use crate::engine::{Carry, Chain};
use crate::error::BuildError;
use crate::rule::Rule;

/// Applies an ordered list of [`Rule`]s to every request.
///
/// Built with [`RateLimitLayer::builder`]; cheap to clone (an `Arc`), and every
/// service it makes shares the same counters.
///
/// ```
/// use axum::{routing::get, Router};
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// let limit = RateLimitLayer::builder()
///     .rule(Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
///     .build()?;
/// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct RateLimitLayer {
    pub(super) shared: Arc<Shared>,
}

/// A handle that does not keep the layer alive: the rules file's watcher
/// holds one, so it stops once every clone and service of the layer is gone.
#[cfg(feature = "config")]
pub(crate) struct WeakLayer(Weak<Shared>);

#[cfg(feature = "config")]
impl WeakLayer {
    pub(crate) fn upgrade(&self) -> Option<RateLimitLayer> {
        self.0.upgrade().map(|shared| RateLimitLayer { shared })
    }
}

impl RateLimitLayer {
    /// The layer's rules as they are now, for deciding keys handed to them:
    /// see [`KeyedRules`].
    pub fn keyed(&self) -> KeyedRules {
        KeyedRules {
            chain: self.shared.chain.load(),
            shared: self.shared.clone(),
        }
    }

    #[cfg(feature = "config")]
    pub(crate) fn downgrade(&self) -> WeakLayer {
        WeakLayer(Arc::downgrade(&self.shared))
    }

    /// Wraps `inner`, as [`tower::Layer::layer`](Layer::layer) does, without
    /// naming `tower` (an axum app has no direct dependency on it): e.g. a
    /// whole `Router`, served with axum's `ServiceExt`.
    pub fn layer<S>(&self, inner: S) -> RateLimitService<S> {
        RateLimitService::new(inner, self.shared.clone())
    }

    /// The rules, in evaluation order: those of the last
    /// [`reload`](Self::reload), if any.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("a", KeyExtractor::everyone(), Quota::per_second(1)))
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
    /// [`build`](crate::rate_limit::RateLimitBuilder::build) checks them; the layer's other
    /// settings stay. Each request is decided wholly by the rules it
    /// started with, old or new, never a mix; requests already waiting
    /// (`OnDeny::Wait`, Redis) finish on the old ones.
    ///
    /// A rule whose name, key, quota (static, or still a `quota_fn`),
    /// algorithm, scope and key-space settings (`max_keys`,
    /// `on_key_space_full`) are unchanged (for global rules, also its Redis
    /// backend, failure policy, `lease` and `coalesce`) keeps its counters,
    /// its cached denies and its circuit breaker, so a reload hands nobody
    /// a fresh quota. A rule
    /// whose static quota alone changed keeps each key's usage as its
    /// [`QuotaChange`](crate::rule::QuotaChange) says, counting every
    /// request the old rules decided until the swap. Any other rule starts
    /// whole. On an error the running rules stay.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .build()?;
    /// layer.reload([Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(500))])?;
    /// assert_eq!(layer.rules()[0].static_quota(), Some(Quota::per_minute(500)));
    /// assert!(layer.reload([Rule::new("api", KeyExtractor::everyone(), Quota::per_second(0))]).is_err());
    /// assert_eq!(layer.rules()[0].static_quota(), Some(Quota::per_minute(500)), "unchanged");
    /// # Ok::<(), keyed_rate_limit::BuildError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimitBuilder::build`](crate::rate_limit::RateLimitBuilder::build) for the rules; see [`BuildError`].
    pub fn reload(&self, rules: impl IntoIterator<Item = Rule>) -> Result<(), BuildError> {
        let shared = &*self.shared;
        let _one = shared
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = shared.chain.load();
        let mut new = Chain::compile(
            rules.into_iter().collect(),
            shared.config,
            shared.headers.draft(),
            Some(&old),
        )?;
        let kept = new.kept_from(&old);
        let (count, converted) = (new.rules().count(), new.converted);
        let carries = std::mem::take(&mut new.carries);
        // Forwarded at the swap: a request decided on the old chain sees
        // every old store forwarding, or none.
        shared
            .chain
            .store_with(Arc::new(new), || carries.iter().for_each(Carry::forward));
        // The old rules decide no more: what each key used under them is
        // whole now. Keys met meanwhile carried themselves over.
        carries.into_iter().for_each(Carry::settle);
        tracing::info!(target: crate::observe::TARGET, rules = count, kept, converted, "rate-limit rules reloaded");
        Ok(())
    }

    /// Writes the local rules' counters to `w`, for
    /// [`RateLimitBuilder::restore`](crate::rate_limit::RateLimitBuilder::restore) in
    /// the next process; see [`snapshot`](crate::snapshot) for what is
    /// saved and the format. Requests go on meanwhile: each key is read
    /// once, as it stands.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Io`](crate::snapshot::SnapshotError::Io) when `w` fails.
    pub fn snapshot(&self, w: impl std::io::Write) -> Result<(), crate::snapshot::SnapshotError> {
        let rules = self.shared.chain.load().export();
        crate::snapshot::write(w, &rules, crate::util::instant::unix_us())
    }

    /// What the layer enforces, as a Markdown table or a Mermaid flowchart:
    /// documentation that can't drift from the code.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .build().unwrap();
    /// println!("{}", layer.describe().markdown());
    /// assert!(layer.describe().mermaid().contains("1. api"));
    /// ```
    pub fn describe(&self) -> crate::describe::Description {
        crate::describe::Description::new(
            self.shared.chain.load().rules(),
            self.shared.exempt.is_some(),
        )
    }

    /// How many keys the local backend holds now, across rules: a gauge
    /// for memory. Keys whose buckets are full again are swept in the
    /// background (see [`RateLimitBuilder::cleanup_interval`](crate::rate_limit::RateLimitBuilder::cleanup_interval)).
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// # let layer = RateLimitLayer::builder()
    /// #     .rule(Rule::new("a", KeyExtractor::everyone(), Quota::per_second(1))).build().unwrap();
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
    /// # use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// # let layer = RateLimitLayer::builder()
    /// #     .rule(Rule::new("a", KeyExtractor::everyone(), Quota::per_second(1))).build().unwrap();
    /// assert!(layer.breakers().is_empty(), "local rules have no breaker");
    /// ```
    pub fn breakers(&self) -> Vec<crate::failure::BreakerStatus> {
        self.shared.chain.load().breakers()
    }

    /// Sweeps keys whose buckets are full again now, instead of waiting for
    /// the background sweep. Dropping them changes no decision.
    #[doc(hidden)]
    pub fn cleanup(&self) {
        self.shared.chain.load().cleanup();
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitLayer::layer(self, inner)
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
