#![doc = include_str!("../../../docs/redis.md")]

mod error;
mod instances;
mod keys;
mod pinger;
mod script;
#[cfg(feature = "redis-tls")]
mod tls;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bb8_redis::{RedisConnectionManager, bb8};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;

pub use error::RedisBackendError;
pub(crate) use instances::LiveCount;
use instances::Membership;
pub(crate) use instances::process_id;
pub(crate) use script::{ControlScriptOp, Decided, Grant, LeaseOp, LeaseReply};

use crate::error::BuildError;
use crate::failure::{FailureMode, FailurePolicy, Liveness};
use crate::key::DEFAULT_MAX_KEY_LEN;
use crate::rule::Lockout;
use crate::{Algorithm, Decision, Key, Quota};

/// How the backend talks to Redis.
///
/// ```
/// use keyed_rate_limit::backend::redis::ConnectionMode;
/// assert_eq!(ConnectionMode::default(), ConnectionMode::Multiplexed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ConnectionMode {
    /// One pipelined connection shared by all requests, reconnected in the
    /// background when it drops. The default: it measured faster than a pool
    /// at concurrency 64 (see `notes/redis-connection.md`).
    #[default]
    Multiplexed,
    /// A bb8 pool of up to `max_size` connections, each pinged on checkout.
    Pool {
        /// The most connections the pool opens.
        max_size: u32,
    },
    /// A Redis Cluster: one multiplexed connection per node, commands routed
    /// by key slot, `MOVED`/`ASK` redirections and failovers followed by the
    /// client. Set by [`RedisBackend::cluster_builder`].
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    Cluster,
}

impl ConnectionMode {
    fn is_cluster(self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if self == Self::Cluster {
            return true;
        }
        false
    }
}

/// Configures and connects a [`RedisBackend`]; see [`RedisBackend::builder`].
/// Its `Debug` output shows URLs without their passwords.
///
/// ```
/// use keyed_rate_limit::backend::redis::RedisBackend;
/// let b = RedisBackend::builder("redis://app:s3cret@redis.internal:6379");
/// let shown = format!("{b:?}");
/// assert!(shown.contains("redis://app:***@redis.internal:6379") && !shown.contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct RedisBackendBuilder {
    urls: Vec<String>,
    prefix: String,
    mode: ConnectionMode,
    lazy: bool,
    live_ttl: Option<Duration>,
    instance_id: Option<String>,
    #[cfg(feature = "redis-tls")]
    tls: tls::Tls,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        let mut d = f.debug_struct("RedisBackendBuilder");
        d.field("urls", &urls)
            .field("prefix", &self.prefix)
            .field("mode", &self.mode)
            .field("lazy", &self.lazy)
            .field("live_ttl", &self.live_ttl);
        #[cfg(feature = "redis-tls")]
        d.field("tls", &self.tls);
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
    /// With [`ConnectionMode::Multiplexed`]: don't connect in `build`, but
    /// on the first decision. A gateway then starts while Redis is down, and
    /// its global rules follow their failure modes until Redis answers. The
    /// eviction-policy check is skipped (it has no server to ask).
    ///
    /// ```
    /// # use keyed_rate_limit::backend::redis::RedisBackend;
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

    /// Keeps a live count of the gateways sharing this Redis (and prefix):
    /// the backend announces itself every `ttl / 3` in a sorted set scored
    /// by expiry on Redis time, and counts those whose announcement is
    /// younger than `ttl`. A rule's `LocalFallback` then divides its quota
    /// by the last count read, which follows gateways joining and leaving
    /// (within `ttl`; a backend dropped while its runtime still runs leaves
    /// at once), instead of by
    /// [`RateLimitBuilder::instances`](crate::RateLimitBuilder::instances),
    /// which stays the divisor until a count is read. A count that falls
    /// takes effect a TTL later (a rise at once), so a Redis restarted
    /// empty or a flapping gateway never widens every share at once. While
    /// Redis is down the last count holds. `ttl` must be at least 30 ms; a few seconds
    /// suits most fleets. A gateway is its process (backends of one process
    /// count once), or what [`instance_id`](Self::instance_id) names.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::backend::redis::RedisBackend;
    /// let builder = RedisBackend::builder("redis://redis.internal:6379")
    ///     .live_instances(Duration::from_secs(3));
    /// ```
    pub fn live_instances(mut self, ttl: Duration) -> Self {
        self.live_ttl = Some(ttl);
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
        self.mode = mode;
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
            .connect(self.mode, self.lazy)
            .await
            .map_err(RedisBackendError::at_start_up)?;
        if self.live_ttl.is_some_and(|t| t < Duration::from_millis(30)) {
            return Err(RedisBackendError::Unsupported(
                "live_instances needs a TTL of at least 30 ms",
            ));
        }
        let pinger = self.clone();
        let backend = RedisBackend {
            inner: Arc::new(Inner {
                prefix: self.prefix,
                conn,
                liveness: Liveness::new(Some(Box::new(move |heard| pinger::start(pinger, heard)))),
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
        if !(self.lazy && self.mode == ConnectionMode::Multiplexed) {
            backend.read_eviction_policy().await;
            // Loads every script now: the first requests don't pay for it,
            // and an ACL that forbids scripts fails here, not per request.
            backend
                .load_scripts()
                .await
                .map_err(RedisBackendError::at_start_up)?;
        }
        Ok(backend)
    }

    async fn connect(&self, mode: ConnectionMode, lazy: bool) -> Result<Conn, RedisBackendError> {
        let url = self.urls.first().map_or("", String::as_str);
        #[cfg(feature = "redis-tls")]
        let certs = self.tls.certificates();
        Ok(match mode {
            ConnectionMode::Multiplexed => {
                #[cfg(feature = "redis-tls")]
                let client = match certs {
                    Some(c) => redis::Client::build_with_tls(url, c)?,
                    None => redis::Client::open(url)?,
                };
                #[cfg(not(feature = "redis-tls"))]
                let client = redis::Client::open(url)?;
                // Few retries so a bad URL fails the build fast; after a drop,
                // every later call starts a new reconnect attempt anyway.
                // The rules' guards time every call out (`redis_timeout`,
                // patient while Redis answers pings); redis-rs's own 500 ms
                // would fail a busy but live Redis first. This only bounds
                // what runs outside a guard (start-up).
                // A refused reconnect is told within tens of milliseconds,
                // inside a rule's timeout: the breaker, not redis-rs's
                // backoff (100 ms, doubling), paces a dead server.
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(50))
                    .set_response_timeout(Some(UNGUARDED_TIMEOUT));
                Conn::Multiplexed(if lazy {
                    ConnectionManager::new_lazy_with_config(client, config)?
                } else {
                    ConnectionManager::new_with_config(client, config).await?
                })
            }
            #[cfg(feature = "redis-tls")]
            ConnectionMode::Pool { .. } if certs.is_some() => {
                return Err(RedisBackendError::Unsupported(
                    "custom TLS certificates need the multiplexed or cluster connection",
                ));
            }
            ConnectionMode::Pool { max_size } => {
                let manager = RedisConnectionManager::new(url)?;
                // The first connection is made here so a bad URL fails the build,
                // at once rather than after bb8's 30 s of retries.
                let pool = bb8::Pool::builder()
                    .max_size(max_size.max(1))
                    .min_idle(Some(1))
                    .retry_connection(false)
                    .build(manager)
                    .await?;
                Conn::Pool(pool)
            }
            #[cfg(feature = "redis-cluster")]
            ConnectionMode::Cluster => {
                // redis-rs retries a failed node 16 times, waiting 1.28 s
                // and up between tries: a call to a dead master's slots hung
                // past a second. Its retries also count redirects (MOVED,
                // ASK, TRYAGAIN in a resharding): four quick tries, then
                // the error reaches the rule's guard and failure mode,
                // which pace a dead node themselves.
                let client = ClusterClient::builder(self.urls.iter().map(String::as_str))
                    .retries(4)
                    .min_retry_wait(5)
                    .max_retry_wait(20)
                    .retry_wait_formula(10, 2);
                #[cfg(feature = "redis-tls")]
                let client = match certs {
                    Some(c) => client.certs(c),
                    None => client,
                };
                let client = client.build()?;
                Conn::Cluster(client.get_async_connection().await?)
            }
        })
    }
}

/// The longest a call outside a rule's guard waits for its reply.
const UNGUARDED_TIMEOUT: Duration = Duration::from_secs(10);

/// A global rate-limit backend on a shared Redis. Cloning is cheap and clones
/// share the connection.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    prefix: String,
    conn: Conn,
    liveness: Liveness,
    eviction_policy: std::sync::OnceLock<String>,
    /// This gateway in the live instance count, when it is kept.
    membership: Option<Membership>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.liveness.stop();
        // Leave the live count now rather than when the TTL runs out.
        if let Some(m) = self.membership.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let conn = self.conn.clone();
            let leave = instances::leave(&self.prefix, &m);
            rt.spawn(async move {
                let _ = tokio::time::timeout(m.ttl, conn.invoke::<i64>(None, &leave)).await;
            });
        }
    }
}

/// Extra `EVALSHA`/`SCRIPT LOAD` rounds after the redis crate's own one.
/// Each round is lost only when a flush lands between its load and its
/// call, so a few more rounds cost nothing until Redis forgets its scripts
/// (5 lost 5 of 600 decisions to a `SCRIPT FLUSH` every 2 ms on a busy
/// 2-core machine); the layer's timeout still bounds the whole.
const NOSCRIPT_ROUNDS: u32 = 20;

#[derive(Clone)]
enum Conn {
    Multiplexed(ConnectionManager),
    Pool(bb8::Pool<RedisConnectionManager>),
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.inner.conn {
            Conn::Multiplexed(_) => "multiplexed",
            Conn::Pool(_) => "pool",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("connection", &mode)
            .finish()
    }
}

impl RedisBackend {
    /// Starts configuring a backend for the Redis at `url`.
    ///
    /// ```
    /// use keyed_rate_limit::backend::redis::{ConnectionMode, RedisBackend};
    /// let builder = RedisBackend::builder("rediss://user:pw@redis.internal:6380")
    ///     .prefix("gateway-rl")
    ///     .connection(ConnectionMode::Pool { max_size: 16 });
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            urls: vec![url.into()],
            prefix: "krl".to_owned(),
            mode: ConnectionMode::default(),
            lazy: false,
            live_ttl: None,
            instance_id: None,
            #[cfg(feature = "redis-tls")]
            tls: tls::Tls::default(),
        }
    }

    /// Starts configuring a backend for a Redis Cluster reachable through any
    /// of `nodes` (the client discovers the rest). Every key one script
    /// touches shares a hash tag, so scripts never cross slots.
    ///
    /// ```
    /// use keyed_rate_limit::backend::redis::RedisBackend;
    /// let builder = RedisBackend::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .prefix("gateway-rl");
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn cluster_builder<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut b = Self::builder(String::new());
        b.urls = nodes.into_iter().map(Into::into).collect();
        b.mode = ConnectionMode::Cluster;
        b
    }

    /// Whether a rule name can be used with this backend: it must not contain
    /// braces, which would break the key's hash tag. Check it when rules are built.
    ///
    /// ```
    /// use keyed_rate_limit::backend::redis::RedisBackend;
    /// assert!(RedisBackend::validate_rule_name("api:v1").is_ok());
    /// assert!(RedisBackend::validate_rule_name("a{b}").is_err());
    /// ```
    pub fn validate_rule_name(rule: &str) -> Result<(), RedisBackendError> {
        keys::validate_name("rule", rule)
    }

    /// Counts `cost` units of `key` under `rule` and decides, atomically in Redis.
    ///
    /// A cost that can never pass (above the burst for GCRA and token bucket,
    /// above the limit for the window algorithms) returns [`Decision::never`]
    /// without calling Redis. A deny does not consume anything. Keys longer
    /// than [`DEFAULT_MAX_KEY_LEN`] count
    /// as their SHA-256, as in the layer with its default bound.
    pub async fn check(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, RedisBackendError> {
        keys::validate_name("rule", rule)?;
        quota.validate().map_err(RedisBackendError::InvalidQuota)?;
        let key = key.clone().bounded(DEFAULT_MAX_KEY_LEN);
        let decided = self
            .check_next(rule, &key, algorithm, quota, cost, None)
            .await?;
        Ok(decided.decision)
    }

    /// [`check`](Self::check) for a key the layer already bounded, with
    /// the rule's lockout; for an allow that left nothing, also the wait
    /// until one more unit fits: the deny cache can then answer the next
    /// requests without asking Redis for the deny first.
    pub(crate) async fn check_next(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        cost: u32,
        lockout: Option<Lockout>,
    ) -> Result<Decided, RedisBackendError> {
        // The rule chain checked the name and quota when it was built (and
        // request-time quotas before calling): no per-request re-check.
        if cost > algorithm.capacity(quota) {
            return Ok(Decided {
                decision: Decision::never(quota.limit(), quota.window()),
                next: None,
                locked: false,
                lock_started: false,
            });
        }
        let redis_key = self.state_key(rule, key, algorithm, quota);
        if let Some(period) = quota.period() {
            let invocation = script::calendar(redis_key, quota, period, &[cost], lockout);
            let reply: script::CalendarReply = self.invoke(&invocation).await?;
            return Ok(script::calendar_decision(quota, reply));
        }
        let invocation = script::rate(algorithm, redis_key, quota, &[cost], lockout);
        let reply: script::Reply = self.invoke(&invocation).await?;
        Ok(script::decision(quota, reply))
    }

    /// [`check_next`](Self::check_next) for several requests of one key
    /// in one script call: each cost decided in turn, as if each were its
    /// own call, in order. Every cost must fit the quota's capacity (the
    /// chain checks before asking).
    pub(crate) async fn check_batch(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        costs: &[u32],
        lockout: Option<Lockout>,
    ) -> Result<Vec<Decided>, RedisBackendError> {
        let redis_key = self.state_key(rule, key, algorithm, quota);
        let (invocation, width) = match quota.period() {
            Some(period) => (
                script::calendar(redis_key, quota, period, costs, lockout),
                6,
            ),
            None => (script::rate(algorithm, redis_key, quota, costs, lockout), 5),
        };
        let flat: Vec<i64> = self.invoke(&invocation).await?;
        Ok(script::batch_decisions(quota, &flat, width))
    }

    /// Leases `need` units of `key`'s quota or none, up to `want`, to
    /// `holder` for at most `lease`, after giving back `back` units of its
    /// last lease: one `grant.lua` call on the state the rate script of
    /// `algorithm` keeps (the caller passes the quota the lease is counted
    /// in).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn grant(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        sizes: (u32, u32),
        holder: &str,
        lease: Duration,
        back: u32,
    ) -> Result<Grant, RedisBackendError> {
        let redis_key = self.state_key(rule, key, algorithm, quota);
        let invocation = script::grant(algorithm, redis_key, quota, sizes, holder, lease, back);
        let reply: script::GrantReply = self.invoke(&invocation).await?;
        Ok(script::grant_reply(reply))
    }

    /// The key a rate script keeps `key`'s state in.
    fn state_key(&self, rule: &str, key: &Key, algorithm: Algorithm, quota: &Quota) -> Vec<u8> {
        let prefix = &self.inner.prefix;
        if quota.period().is_some() {
            keys::tagged_key(prefix, rule, key, keys::CALENDAR)
        } else {
            keys::redis_key(prefix, rule, key, algorithm)
        }
    }

    /// Runs the control handle's `op` on `key`: for an adjustment or a
    /// read, what a request of one unit would be told now.
    pub(crate) async fn control(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        op: ControlScriptOp,
    ) -> Result<Decision, RedisBackendError> {
        let redis_key = self.state_key(rule, key, algorithm, quota);
        let invocation = script::control(algorithm, redis_key, quota, op);
        let reply: script::ControlReply = self.invoke(&invocation).await?;
        Ok(script::control_decision(quota, reply))
    }

    /// Runs `lease.lua` on the lease set of `key` under the concurrency
    /// limit `limit`; see [`ConcurrencyLimitBuilder::global`](crate::concurrency::ConcurrencyLimitBuilder::global).
    pub(crate) async fn lease(
        &self,
        limit: &str,
        key: &Key,
        op: LeaseOp<'_>,
    ) -> Result<LeaseReply, RedisBackendError> {
        let inner = &*self.inner;
        let redis_key = keys::tagged_key(&inner.prefix, limit, key, keys::LEASE);
        let reply = self.invoke(&script::lease(redis_key, op)).await?;
        Ok(script::lease_reply(reply))
    }

    /// Renews every lease in `ids` on `key`'s lease set in one call: which
    /// of them were still held (and are now extended by `ttl`).
    pub(crate) async fn renew_leases<S: AsRef<str>>(
        &self,
        limit: &str,
        key: &Key,
        ids: &[S],
        ttl: Duration,
    ) -> Result<Vec<bool>, RedisBackendError> {
        let inner = &*self.inner;
        let redis_key = keys::tagged_key(&inner.prefix, limit, key, keys::LEASE);
        let held: Vec<i64> = self.invoke(&script::renew(redis_key, ids, ttl)).await?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }

    /// The one path every script takes: `EVALSHA`, and `SCRIPT LOAD` after
    /// `NOSCRIPT`. A flush can land between the load and the retry (Redis
    /// restarting, `SCRIPT FLUSH` in a loop): a few more rounds, then the error.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisBackendError> {
        self.inner
            .conn
            .invoke(Some(&self.inner.liveness), invocation)
            .await
    }

    async fn load_scripts(&self) -> Result<(), RedisBackendError> {
        for source in script::SOURCES {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            self.inner.conn.query::<redis::Value>(&load).await?;
        }
        Ok(())
    }

    /// Replies and pongs, so a guarded call can tell a busy reader from a
    /// silent server.
    /// Whether both are handles to one backend (one connection set).
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many gateways announced themselves within the TTL at the last
    /// count ([`RedisBackendBuilder::live_instances`]); `None` when the
    /// count is not kept or none was read yet.
    pub fn live_instances(&self) -> Option<u32> {
        self.inner.membership.as_ref()?.count.read()
    }

    /// The live count the failure mode divides by, when it is kept.
    pub(crate) fn live_count(&self) -> Option<Arc<LiveCount>> {
        Some(self.inner.membership.as_ref()?.count.clone())
    }

    pub(crate) fn liveness(&self) -> &Liveness {
        &self.inner.liveness
    }

    /// Reads `maxmemory-policy` and warns (`tracing::warn!`, target
    /// `keyed_rate_limit`) when Redis may evict limit state, which silently
    /// resets a key's limit: `allkeys-*` evicts any key, and `volatile-*`
    /// evicts ours too since they all have a TTL.
    ///
    /// Returns the policy, or `None` when it cannot be read (e.g. `CONFIG` is
    /// renamed or denied by ACL, as on many managed services).
    /// [`RedisBackendBuilder::build`] reads it once, and each global rule
    /// or concurrency limit built on this backend then warns under its name.
    pub async fn eviction_policy_warning(&self) -> Option<String> {
        let policy = self.read_eviction_policy().await?;
        if evicts(&policy) {
            tracing::warn!(
                target: crate::observe::TARGET,
                maxmemory_policy = %policy,
                "redis may evict rate-limit keys under memory pressure, resetting their limits; \
                 use maxmemory-policy noeviction"
            );
        }
        Some(policy)
    }

    async fn read_eviction_policy(&self) -> Option<String> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        let reply = self.inner.conn.query::<Vec<String>>(&cmd).await;
        let policy = match reply {
            Ok(pair) => pair.into_iter().nth(1)?,
            Err(e) => {
                tracing::debug!(target: "keyed_rate_limit", error = %e, "cannot read redis maxmemory-policy");
                return None;
            }
        };
        let _ = self.inner.eviction_policy.set(policy.clone());
        Some(policy)
    }

    /// The `maxmemory-policy` read at build, when it may evict limit state.
    pub(crate) fn evicting_policy(&self) -> Option<&str> {
        self.inner
            .eviction_policy
            .get()
            .map(String::as_str)
            .filter(|p| evicts(p))
    }
}

fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// What a limit on Redis needs: a name that keeps the hash tag, a timeout
/// and a breaker that can trip. Also warns, naming the limit, about settings
/// that let a fleet over-admit: a local fallback with no instance count, and
/// a Redis that may evict limit state.
pub(crate) fn validate_global(
    name: &str,
    failure: &FailurePolicy,
    redis: &RedisBackend,
    instances: Option<u32>,
) -> Result<(), BuildError> {
    if keys::validate_name("rule", name).is_err() {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    if failure.timeout.is_zero() {
        return Err(BuildError::InvalidSetting("redis_timeout must be positive"));
    }
    if failure.breaker.threshold() == 0 {
        return Err(BuildError::InvalidSetting(
            "failure_threshold must be at least 1",
        ));
    }
    if instances.is_none()
        && failure.mode == FailureMode::LocalFallback
        && redis.inner.membership.is_none()
    {
        tracing::warn!(
            target: "keyed_rate_limit",
            rule = name,
            "local_fallback without instances(n): when Redis fails, every gateway admits the whole quota; \
             set instances to the number of gateways (or instances(1) for one)"
        );
    }
    if let Some(policy) = redis.evicting_policy() {
        tracing::warn!(
            target: "keyed_rate_limit",
            rule = name,
            maxmemory_policy = policy,
            "redis may evict this rule's keys under memory pressure, resetting its limits; \
             use maxmemory-policy noeviction"
        );
    }
    Ok(())
}

/// `PING`, on every master of a cluster.
async fn ping(conn: &Conn) -> Result<(), RedisBackendError> {
    conn.query::<redis::Value>(&redis::cmd("PING"))
        .await
        .map(drop)
}

impl Conn {
    /// See [`RedisBackend::invoke`]; replies count as heard on `liveness`.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        liveness: Option<&Liveness>,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisBackendError> {
        let mut rounds = 0;
        loop {
            let reply = match self {
                Conn::Multiplexed(conn) => invocation.invoke_async(&mut conn.clone()).await,
                Conn::Pool(pool) => invocation.invoke_async(&mut *pool.get().await?).await,
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(conn) => invocation.invoke_async(&mut conn.clone()).await,
            };
            // A cluster's replies come from whichever node owns the key, so
            // they prove nothing of a silent one: there only the pinger's
            // PING, which every primary must answer, counts.
            if let Some(liveness) = liveness
                && !self.is_cluster()
                && !reply.as_ref().is_err_and(|e| e.is_io_error())
            {
                liveness.heard();
            }
            match reply {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                        && rounds < NOSCRIPT_ROUNDS =>
                {
                    rounds += 1;
                }
                reply => return Ok(reply?),
            }
        }
    }

    fn is_cluster(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if let Conn::Cluster(_) = self {
            return true;
        }
        false
    }

    /// One command on whichever connection this is (a cluster routes it).
    async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisBackendError> {
        Ok(match self {
            Conn::Multiplexed(conn) => cmd.query_async(&mut conn.clone()).await?,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await?,
            Conn::Pool(pool) => cmd.query_async(&mut *pool.get().await?).await?,
        })
    }
}
