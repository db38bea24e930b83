//! The builder: URLs, prefix, connection mode, TLS and the live instance
//! count, checked and connected by `build`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::backend::{Inner, RedisBackend};
use super::endpoint::{ConnectionMode, Endpoint};
use super::error::RedisBackendError;
use super::membership::Membership;
#[cfg(feature = "redis-tls")]
use super::tls::Tls;
use super::{instances, keys, pinger};
use crate::failure::Reachability;

/// The live instance count's TTL unless
/// [`live_instances`](RedisBackendBuilder::live_instances) sets another: a
/// gateway announces itself every second, and one that died leaves the
/// count within 3 s.
pub const DEFAULT_LIVE_TTL: Duration = Duration::from_secs(3);

/// Configures and connects a [`RedisBackend`]; see [`RedisBackend::builder`].
/// Its `Debug` output shows URLs without their passwords.
///
/// ```
/// use keyed_rate_limit::RedisBackend;
/// let b = RedisBackend::builder("redis://app:s3cret@redis.internal:6379");
/// let shown = format!("{b:?}");
/// assert!(shown.contains("redis://app:***@redis.internal:6379") && !shown.contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct RedisBackendBuilder {
    pub(super) endpoint: Endpoint,
    pub(super) prefix: String,
    pub(super) lazy: bool,
    pub(super) live_ttl: Option<Duration>,
    pub(super) instance_id: Option<String>,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.endpoint.urls.iter().map(|u| redact(u)).collect();
        let mut d = f.debug_struct("RedisBackendBuilder");
        d.field("urls", &urls)
            .field("prefix", &self.prefix)
            .field("mode", &self.endpoint.mode)
            .field("lazy", &self.lazy)
            .field("live_ttl", &self.live_ttl);
        #[cfg(feature = "redis-tls")]
        d.field("tls", &self.endpoint.tls);
        d.finish()
    }
}

/// `url` with the password of its user info replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

impl RedisBackendBuilder {
    /// Don't connect in `build`, but on the first decision, in every
    /// connection mode (multiplexed, pool, cluster, sentinel). A gateway
    /// then starts while Redis is down, and its global rules follow their
    /// failure modes until Redis answers. The eviction-policy check and the
    /// scripts' preloading are skipped (there is no server to ask); scripts
    /// load on first use.
    ///
    /// ```
    /// # use keyed_rate_limit::RedisBackend;
    /// let builder = RedisBackend::builder("redis://redis.internal:6379").connect_lazily();
    /// ```
    pub fn connect_lazily(mut self) -> Self {
        self.lazy = true;
        self
    }

    /// Prepended to every Redis key (default `krl`); must not contain braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the TTL of the live count of the gateways sharing this Redis
    /// (and prefix), which is on by default with a TTL of
    /// [`DEFAULT_LIVE_TTL`] (3 s): the backend announces itself every
    /// `ttl / 3` in a sorted set scored by expiry on Redis time, and counts
    /// those whose announcement is younger than `ttl`. A rule's
    /// `LocalFallback` then divides its quota by the last count read, which
    /// follows gateways joining and leaving (within `ttl`; a backend
    /// dropped while its runtime still runs leaves at once), and never by
    /// less than
    /// [`RateLimitBuilder::instances`](crate::rate_limit::RateLimitBuilder::instances),
    /// which is also the divisor until a count is read. A count that falls
    /// takes effect a TTL later (a rise at once), so a Redis restarted
    /// empty or a flapping gateway never widens every share at once. While
    /// Redis is down the last count holds. `ttl` must be at least 30 ms; a few seconds
    /// suits most fleets. A gateway is its process (backends of one process
    /// count once), or what [`instance_id`](Self::instance_id) names.
    /// [`without_live_instances`](Self::without_live_instances) turns the
    /// count off.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::RedisBackend;
    /// let builder = RedisBackend::builder("redis://redis.internal:6379")
    ///     .live_instances(Duration::from_secs(3));
    /// ```
    pub fn live_instances(mut self, ttl: Duration) -> Self {
        self.live_ttl = Some(ttl);
        self
    }

    /// Keeps no live count (see [`live_instances`](Self::live_instances)):
    /// no announcements, no key in Redis for them, and `LocalFallback`
    /// divides by [`RateLimitBuilder::instances`](crate::rate_limit::RateLimitBuilder::instances)
    /// alone, which a rule then warns about at build time when it was never
    /// set. For a Redis whose ACL forbids the count's sorted set, or a
    /// gateway that knows its fleet's size.
    ///
    /// ```
    /// # use keyed_rate_limit::RedisBackend;
    /// let builder = RedisBackend::builder("redis://redis.internal:6379").without_live_instances();
    /// ```
    pub fn without_live_instances(mut self) -> Self {
        self.live_ttl = None;
        self
    }

    /// The name this gateway has in the live count (default: its process,
    /// by pid and start time). A pod or host name makes a restarted
    /// gateway take its old place instead of counting twice until the TTL
    /// runs out.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Multiplexed connection or pool (default [`ConnectionMode::Multiplexed`]).
    pub fn connection(mut self, mode: ConnectionMode) -> Self {
        self.endpoint.mode = mode;
        self
    }

    /// Validates the prefix, connects, and reads Redis's `maxmemory-policy`:
    /// each rule built on the backend warns when Redis may evict its state
    /// (see [`RedisBackend::eviction_policy_warning`]).
    ///
    /// The URL may be `redis://` or `rediss://` (TLS) and carry credentials:
    /// `redis://:password@host:6379/0` or `redis://user:password@host`.
    pub async fn build(self) -> Result<RedisBackend, RedisBackendError> {
        keys::validate_name("prefix", &self.prefix)?;
        let conn = self
            .endpoint
            .connect(self.endpoint.mode, self.lazy)
            .await
            .map_err(|e| e.at_start_up(&self.endpoint.urls))?;
        if self.live_ttl.is_some_and(|t| t < Duration::from_millis(30)) {
            return Err(RedisBackendError::Unsupported(
                "live_instances needs a TTL of at least 30 ms",
            ));
        }
        let pinger = self.endpoint.clone();
        let backend = RedisBackend {
            inner: Arc::new(Inner {
                prefix: self.prefix,
                conn,
                reachability: Reachability::new(Some(Box::new(move |heard| {
                    pinger::start(pinger, heard)
                }))),
                eviction_policy: std::sync::OnceLock::new(),
                membership: self
                    .live_ttl
                    .map(|t| Membership::new(t, self.instance_id.clone())),
            }),
        };
        if let Some(ttl) = self.live_ttl {
            // Counted before the first decision when Redis is up.
            if !self.lazy {
                instances::announce(&backend).await;
            }
            instances::start(Arc::downgrade(&backend.inner), ttl);
        }
        if !self.lazy {
            backend.read_eviction_policy().await;
            // Loads every script now: the first requests don't pay for it,
            // and an ACL that forbids scripts fails here, not per request.
            backend
                .load_scripts()
                .await
                .map_err(|e| e.at_start_up(&self.endpoint.urls))?;
        }
        Ok(backend)
    }
}

impl RedisBackend {
    /// Starts configuring a backend for the Redis at `url`.
    ///
    /// ```
    /// use keyed_rate_limit::{RedisBackend, backend::redis::ConnectionMode};
    /// let builder = RedisBackend::builder("rediss://user:pw@redis.internal:6380")
    ///     .prefix("gateway-rl")
    ///     .connection(ConnectionMode::Pool { max_size: 16 });
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            endpoint: Endpoint {
                urls: vec![url.into()],
                topology: super::endpoint::Topology::Single,
                mode: ConnectionMode::default(),
                #[cfg(feature = "redis-tls")]
                tls: Tls::default(),
                #[cfg(feature = "redis-sentinel")]
                sentinel: None,
            },
            prefix: "krl".to_owned(),
            lazy: false,
            live_ttl: Some(DEFAULT_LIVE_TTL),
            instance_id: None,
        }
    }

    /// Starts configuring a backend for a Redis Cluster reachable through any
    /// of `nodes` (the client discovers the rest). Every key one script
    /// touches shares a hash tag, so scripts never cross slots.
    ///
    /// ```
    /// use keyed_rate_limit::RedisBackend;
    /// let builder = RedisBackend::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .prefix("gateway-rl");
    /// ```
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut b = Self::builder(String::new());
        b.endpoint.urls = nodes.into_iter().map(Into::into).collect();
        b.endpoint.topology = super::endpoint::Topology::Cluster;
        b
    }
}

#[cfg(feature = "redis-tls")]
impl RedisBackendBuilder {
    /// For `rediss://`: trust this PEM root certificate instead of the
    /// system's store, e.g. a private CA. Multiplexed and cluster modes.
    ///
    /// ```
    /// # use keyed_rate_limit::RedisBackend;
    /// let ca = b"-----BEGIN CERTIFICATE-----\n...".to_vec();
    /// let builder = RedisBackend::builder("rediss://redis.internal:6380").tls_root_cert(ca);
    /// ```
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.endpoint.tls.root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` with mutual TLS: the client certificate and key, PEM.
    /// Multiplexed and cluster modes.
    ///
    /// ```
    /// # use keyed_rate_limit::RedisBackend;
    /// let (cert, key) = (b"-----BEGIN CERTIFICATE-----".to_vec(), b"-----BEGIN PRIVATE KEY-----".to_vec());
    /// let builder = RedisBackend::builder("rediss://redis.internal:6380").tls_client_cert(cert, key);
    /// ```
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.endpoint.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }
}
