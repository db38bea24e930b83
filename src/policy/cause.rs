//! Why Redis could not decide a global rule's request.

use std::fmt;
use std::time::Duration;

/// Why Redis could not decide.
#[derive(Debug)]
pub(crate) enum Cause {
    Timeout(Duration),
    Error(String),
    CircuitOpen,
    /// The call another request made for this one failed (counted there).
    Waited,
}

impl Cause {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Error(_) | Self::Waited => "error",
            Self::CircuitOpen => "circuit_open",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {d:?}"),
            Self::Error(e) => f.write_str(e),
            Self::CircuitOpen => f.write_str("circuit breaker open"),
            Self::Waited => f.write_str("the redis call this request waited for failed"),
        }
    }
}
