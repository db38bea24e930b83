//! The concurrency layer: its services share one count per key.

use std::sync::Arc;

use tower::Layer;

use super::service::ConcurrencyLimitService;
use super::shared::Shared;
use crate::key::Key;

/// Limits how many requests per key are in flight at once.
///
/// Built with [`ConcurrencyLimitLayer::builder`]; cheap to clone, and every
/// service it makes shares the same counts. Combine it with a
/// [`RateLimitLayer`](crate::RateLimitLayer) to bound both the rate and the
/// parallelism of expensive endpoints.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{ConcurrencyLimitLayer, Key, KeyExtractor};
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
///     .retry_after(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(layer.max_in_flight(), 2);
/// assert_eq!(layer.in_flight(&Key::from("acct_1")), 0);
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct ConcurrencyLimitLayer {
    pub(super) shared: Arc<Shared>,
}

impl ConcurrencyLimitLayer {
    /// Wraps `inner`, as [`tower::Layer::layer`](Layer::layer) does, without
    /// naming `tower` (an axum app has no direct dependency on it).
    pub fn layer<S>(&self, inner: S) -> ConcurrencyLimitService<S> {
        ConcurrencyLimitService::new(inner, self.shared.clone())
    }

    /// The limit's name.
    ///
    /// ```
    /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 1).build().unwrap();
    /// assert_eq!(l.name(), "exports");
    /// ```
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The most requests one key may have in flight.
    ///
    /// ```
    /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 3).build().unwrap();
    /// assert_eq!(l.max_in_flight(), 3);
    /// ```
    pub fn max_in_flight(&self) -> u32 {
        self.shared.limit
    }

    /// How many requests `key` has in flight now through this layer (for a
    /// global limit (feature `redis`), this instance's
    /// share of the total in Redis; keys longer than
    /// [`max_key_len`](crate::concurrency::ConcurrencyLimitBuilder::max_key_len) are looked up
    /// by their hash, as the layer stores them).
    ///
    /// ```
    /// # use keyed_rate_limit::{ConcurrencyLimitLayer, Key, KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 3).build().unwrap();
    /// assert_eq!(l.in_flight(&Key::from("*")), 0);
    /// ```
    pub fn in_flight(&self, key: &Key) -> u32 {
        let key = key.clone().bounded(self.shared.max_key_len);
        self.shared.slots.in_flight(&key)
    }

    /// How many keys this instance holds now (for a global limit too): only
    /// keys with a request in flight are kept, so this is a gauge for memory.
    ///
    /// ```
    /// # use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 3).build().unwrap();
    /// assert_eq!(l.local_keys(), 0);
    /// ```
    pub fn local_keys(&self) -> usize {
        self.shared.slots.keys()
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimitLayer::layer(self, inner)
    }
}

impl std::fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.shared.name)
            .field("key", &self.shared.key)
            .field("max_in_flight", &self.shared.limit)
            .finish_non_exhaustive()
    }
}
