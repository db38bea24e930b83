//! Errors returned when a layer is built; requests never see these.

use std::fmt;

/// Why a [`Quota`](crate::Quota) can never admit a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit is zero.
    ZeroLimit,
    /// The window is zero.
    ZeroWindow,
    /// The burst is zero.
    ZeroBurst,
    /// `window / limit` is below one nanosecond.
    TooFine,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroLimit => "the limit is zero",
            Self::ZeroWindow => "the window is zero",
            Self::ZeroBurst => "the burst is zero",
            Self::TooFine => "window / limit is below one nanosecond",
        })
    }
}

impl std::error::Error for QuotaError {}
