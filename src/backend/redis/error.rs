//! What can go wrong talking to the shared Redis.

use std::fmt;

use redis::RedisError;

use crate::error::QuotaError;

/// Why [`RedisBackend::builder`](super::RedisBackend::builder) or
/// [`RedisBackend::check`](super::RedisBackend::check) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisBackendError {
    /// Redis answered with an error, or could not be reached.
    Redis(RedisError),
    /// Every pooled connection stayed busy for the pool's connection timeout.
    PoolTimeout,
    /// A prefix or rule name contains `{` or `}`, which would break the
    /// cluster hash tag that keeps a script's keys in one slot.
    InvalidName {
        /// `"prefix"` or `"rule"`.
        what: &'static str,
        /// The offending name.
        name: String,
    },
    /// The quota can never admit anything; see [`Quota::validate`](crate::Quota::validate).
    InvalidQuota(QuotaError),
    /// The settings don't go together.
    Unsupported(&'static str),
}

impl fmt::Display for RedisBackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis(e) => write!(f, "redis: {e}"),
            Self::PoolTimeout => f.write_str("timed out waiting for a pooled redis connection"),
            Self::InvalidName { what, name } => {
                write!(f, "redis {what} {name:?} must not contain '{{' or '}}'")
            }
            Self::InvalidQuota(e) => write!(f, "invalid quota: {e}"),
            Self::Unsupported(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for RedisBackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            Self::InvalidQuota(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for RedisBackendError {
    fn from(e: RedisError) -> Self {
        Self::Redis(e)
    }
}

impl From<bb8_redis::bb8::RunError<RedisError>> for RedisBackendError {
    fn from(e: bb8_redis::bb8::RunError<RedisError>) -> Self {
        match e {
            bb8_redis::bb8::RunError::User(e) => Self::Redis(e),
            bb8_redis::bb8::RunError::TimedOut => Self::PoolTimeout,
        }
    }
}

impl crate::failure::CallError for RedisBackendError {
    fn connection_refused(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_connection_refusal())
    }
}
