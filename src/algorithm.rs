//! The counting algorithms a rule can use.
//!
#![doc = include_str!("../docs/algorithm.md")]

use std::fmt;

/// How a rule counts.
///
/// Local rules run on [`governor`], which implements GCRA; [`Algorithm::TokenBucket`]
/// is accepted there too because GCRA is exactly a token bucket measured in time.
/// The window algorithms need a shared counter and are only available for
/// global (Redis) rules; asking for them locally is a build error.
///
/// | algorithm | burst | state per key |
/// |---|---|---|
/// | `Gcra` | yes | one timestamp |
/// | `TokenBucket` | yes | tokens and a timestamp |
/// | `FixedWindow` | no: `limit` per window | one counter |
/// | `SlidingWindow` | no: `limit` per window | two counters |
///
/// ```
/// use keyed_rate_limit::Algorithm;
/// assert_eq!(Algorithm::default(), Algorithm::Gcra);
/// assert_eq!(Algorithm::SlidingWindow.as_str(), "sliding_window");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a smooth rate with a burst.
    #[default]
    Gcra,
    /// Refill `limit` tokens per window up to `burst`; each request takes its cost.
    TokenBucket,
    /// At most `limit` per window, the window starting at the first hit.
    FixedWindow,
    /// The previous window's count, weighted by how much of it still
    /// overlaps, plus the current window's count.
    SlidingWindow,
}

impl Algorithm {
    /// Whether the local backend (governor) can run this algorithm.
    pub(crate) const fn runs_locally(self) -> bool {
        matches!(self, Self::Gcra | Self::TokenBucket)
    }

    /// Whether a burst above the limit means anything to this algorithm.
    #[doc(hidden)]
    pub const fn has_burst(self) -> bool {
        self.runs_locally()
    }

    /// The largest cost one request can ever be granted under `quota`: the
    /// burst for GCRA and the token bucket, the limit for the window
    /// algorithms. A costlier request is refused without `Retry-After`.
    #[doc(hidden)]
    pub const fn capacity(self, quota: &crate::quota::Quota) -> u32 {
        if self.has_burst() {
            quota.burst()
        } else {
            quota.limit()
        }
    }

    /// A short, stable name (`gcra`, `token_bucket`, `fixed_window`, `sliding_window`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Gcra => "gcra",
            Self::TokenBucket => "token_bucket",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
