//! The bandwidth layer: its services and bodies share one budget per key.

use std::sync::Arc;

use tower::Layer;

use super::service::BandwidthLimitService;
use super::shared::{Direction, Shared};

/// Shapes body bytes per key: see the [module docs](super).
///
/// Built with [`BandwidthLimitLayer::builder`]; cheap to clone, and every
/// service it makes shares the same budgets.
///
/// ```
/// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
///
/// let layer = BandwidthLimitLayer::builder("downloads", KeyExtractor::header("x-api-key"), 1 << 20)
///     .burst(64 * 1024)
///     .build()?;
/// assert_eq!(layer.bytes_per_second(), 1 << 20);
/// assert_eq!(
///     layer.to_string(),
///     "bandwidth \"downloads\": 1048576 bytes/s per header:x-api-key, burst 65536, response bodies, local"
/// );
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct BandwidthLimitLayer {
    pub(super) shared: Arc<Shared>,
}

impl BandwidthLimitLayer {
    /// Wraps `inner`, as [`tower::Layer::layer`](Layer::layer) does, without
    /// naming `tower`.
    pub fn layer<S>(&self, inner: S) -> BandwidthLimitService<S> {
        BandwidthLimitService::new(inner, self.shared.clone())
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The bytes a key may move per second.
    pub fn bytes_per_second(&self) -> u32 {
        self.shared.bytes_per_second
    }

    /// The most bytes a key may move at once.
    pub fn burst(&self) -> u32 {
        self.shared.burst
    }

    /// Which bodies are shaped.
    pub fn direction(&self) -> Direction {
        self.shared.direction
    }

    /// How many keys this instance holds now: a gauge for memory, bounded
    /// by `max_keys`.
    ///
    /// ```
    /// # use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
    /// let l = BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), 1000).build().unwrap();
    /// assert_eq!(l.local_keys(), 0);
    /// ```
    pub fn local_keys(&self) -> usize {
        self.shared.meter.local_keys()
    }

    /// The limit as the rate limiter's rules are described: one row, whose
    /// quota is in bytes and whose answer is a delay.
    ///
    /// ```
    /// # use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
    /// let l = BandwidthLimitLayer::builder("dl", KeyExtractor::header("x-api-key"), 65_536).burst(8192).build()?;
    /// let d = l.describe();
    /// assert!(d.markdown().contains("| dl | `header:x-api-key` | 65536 bytes/s, burst 8192 bytes | gcra | local | n/a | delay response bodies; missing key: skip |"));
    /// // The chart speaks of bytes and a delay, not of a quota and a 429.
    /// let chart = d.mermaid();
    /// assert!(chart.contains("gateway: BandwidthLimitLayer"));
    /// assert!(chart.contains("<br/>65536 bytes/s, burst 8192 bytes\"]"));
    /// assert!(chart.contains("{bytes within budget?}"));
    /// assert!(chart.contains("d1 -->|no| delay"));
    /// assert!(!chart.contains("429") && !chart.contains("gcra") && !chart.contains("quota"));
    /// # Ok::<(), keyed_rate_limit::BuildError>(())
    /// ```
    pub fn describe(&self) -> crate::describe::Description {
        let what = format!("{} bodies", self.shared.direction.as_str());
        let s = &self.shared;
        let bytes = (s.bytes_per_second, s.burst);
        crate::describe::Description::bandwidth(s.meter.as_rule(), bytes, &what)
    }
}

impl<S> Layer<S> for BandwidthLimitLayer {
    type Service = BandwidthLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BandwidthLimitLayer::layer(self, inner)
    }
}

/// One line: name, rate, key, burst, direction and scope.
impl std::fmt::Display for BandwidthLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.shared;
        write!(
            f,
            "bandwidth \"{}\": {} bytes/s per {}, burst {}, {} bodies, {}",
            s.name,
            s.bytes_per_second,
            s.key_name,
            s.burst,
            s.direction.as_str(),
            if s.global { "global" } else { "local" }
        )
    }
}

impl std::fmt::Debug for BandwidthLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BandwidthLimitLayer")
            .field("name", &self.shared.name)
            .field("bytes_per_second", &self.shared.bytes_per_second)
            .field("burst", &self.shared.burst)
            .field("direction", &self.shared.direction)
            .finish_non_exhaustive()
    }
}
