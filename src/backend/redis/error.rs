//! What can go wrong talking to the shared Redis.

use std::fmt;

use redis::RedisError;

use crate::quota::QuotaError;

/// Why [`RedisBackend::builder`](super::RedisBackend::builder) or
/// [`RedisBackend::check`](super::RedisBackend::check) failed.
#[non_exhaustive]
pub enum RedisBackendError {
    /// Redis answered with an error, or could not be reached.
    Redis(RedisError),
    /// Redis refused the credentials in the URL (wrong password or user).
    Auth(RedisError),
    /// The ACL user may not run what the backend needs (`SCRIPT LOAD`,
    /// `EVALSHA`, or these commands on its key prefix).
    Permission(RedisError),
    /// A cluster URL points at a Redis without cluster mode.
    NotCluster(RedisError),
    /// The server's TLS certificate is not valid for the host name in the
    /// URL (connect by a name the certificate lists).
    TlsNameMismatch(RedisError),
    /// The server's TLS certificate is signed by a CA the client does not
    /// trust (give a private CA with `tls_root_cert`).
    TlsUnknownIssuer(RedisError),
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
            Self::Auth(e) => write!(f, "redis refused the credentials in the URL: {e}"),
            Self::Permission(e) => write!(
                f,
                "the redis ACL user may not run SCRIPT LOAD and EVALSHA on the backend's keys: {e}"
            ),
            Self::NotCluster(e) => write!(f, "not a redis cluster (cluster mode is disabled): {e}"),
            Self::TlsNameMismatch(e) => write!(
                f,
                "the redis server's TLS certificate is not valid for the host name in the URL: {e}"
            ),
            Self::TlsUnknownIssuer(e) => write!(
                f,
                "the redis server's TLS certificate is signed by an unknown CA (see tls_root_cert): {e}"
            ),
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
            Self::Redis(e)
            | Self::Auth(e)
            | Self::Permission(e)
            | Self::NotCluster(e)
            | Self::TlsNameMismatch(e)
            | Self::TlsUnknownIssuer(e) => Some(e),
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

impl RedisBackendError {
    /// Names a start-up failure's cause where Redis's answer tells it.
    pub(crate) fn at_start_up(self) -> Self {
        let Self::Redis(e) = self else { return self };
        let text = e.to_string();
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || text.contains("WRONGPASS")
            || text.contains("NOAUTH")
        {
            Self::Auth(e)
        } else if e.code() == Some("NOPERM") || text.contains("NOPERM") {
            Self::Permission(e)
        } else if text.contains("cluster support disabled") {
            Self::NotCluster(e)
        // rustls's words, as its Debug and Display spell them.
        } else if text.contains("NotValidForName") || text.contains("not valid for name") {
            Self::TlsNameMismatch(e)
        } else if text.contains("UnknownIssuer") || text.contains("unknown issuer") {
            Self::TlsUnknownIssuer(e)
        } else {
            Self::Redis(e)
        }
    }
}

impl crate::failure::CallError for RedisBackendError {
    fn connection_refused(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_connection_refusal())
    }
}

crate::report::debug_as_display!(RedisBackendError);
