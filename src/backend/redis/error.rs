//! What can go wrong talking to the shared Redis.

use std::fmt;

use redis::RedisError;

use crate::quota::QuotaError;

/// Why [`RedisBackend::builder`](super::RedisBackend::builder) or
/// [`RedisBackend::check`](super::RedisBackend::check) failed.
#[non_exhaustive]
#[derive(Clone)]
pub enum RedisBackendError {
    /// Redis answered with an error, or could not be reached.
    Redis(RedisError),
    /// No server answered at start-up (`build`): `servers` are the URLs
    /// tried, without credentials.
    Unreachable {
        /// The URLs, as given but without user and password.
        servers: String,
        /// Why the connection failed.
        error: RedisError,
    },
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
            Self::Unreachable { servers, error } => {
                write!(f, "cannot connect to redis at {servers}: {error}")
            }
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

/// Each variant's `Display` already ends with its cause's words, so no
/// source is given: a report that prints the chain (this crate's `Debug`,
/// anyhow) would say it twice. Match the variant to reach the cause.
impl std::error::Error for RedisBackendError {}

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
    /// Names a start-up failure's cause where Redis's answer tells it, and
    /// the servers when none could be reached.
    pub(crate) fn at_start_up(self, urls: &[String]) -> Self {
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
        } else if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() {
            Self::Unreachable {
                servers: urls
                    .iter()
                    .map(|u| without_credentials(u))
                    .collect::<Vec<_>>()
                    .join(", "),
                error: e,
            }
        } else {
            Self::Redis(e)
        }
    }
}

/// `redis://user:secret@host:6379/0` as `redis://host:6379/0`.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let host = rest.split('/').next().unwrap_or(rest);
    match host.rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

impl crate::failure::CallError for RedisBackendError {
    fn connection_refused(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_connection_refusal())
    }
}

crate::util::report::debug_as_display!(RedisBackendError);

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_are_left_out_of_a_url() {
        use super::without_credentials as w;
        assert_eq!(w("redis://:pw@10.0.0.1:6379/0"), "redis://10.0.0.1:6379/0");
        assert_eq!(w("rediss://app:p@ss@h:6380"), "rediss://h:6380");
        assert_eq!(w("redis://h:6379"), "redis://h:6379");
    }
}
