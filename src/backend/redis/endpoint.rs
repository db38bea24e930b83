//! Where and how the backend connects: the URLs, the connection mode and
//! the certificates, shared by the builder and the pinger's own connection.

use bb8_redis::{RedisConnectionManager, bb8};
#[cfg(feature = "redis-cluster")]
use futures_util::FutureExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;

use super::backend::UNGUARDED_TIMEOUT;
use super::conn::Conn;
use super::error::RedisBackendError;
#[cfg(feature = "redis-tls")]
use super::tls::Tls;

/// How the backend talks to one Redis server: the transport. Where the
/// servers are (one server, a Redis Cluster, a master behind Sentinel) is
/// the builder's: [`RedisBackend::builder`](super::RedisBackend::builder),
/// `cluster_builder` or `sentinel_builder`, which keep one multiplexed
/// connection per node and refuse a pool.
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
    /// at concurrency 64 ([BENCHMARKS.md](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/BENCHMARKS.md)).
    #[default]
    Multiplexed,
    /// A bb8 pool of up to `max_size` connections, each pinged on checkout.
    Pool {
        /// The most connections the pool opens.
        max_size: u32,
    },
}

/// Where the servers are, set by the builder a backend starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Topology {
    /// One server (or a proxy in front of several).
    #[default]
    Single,
    /// A Redis Cluster: one multiplexed connection per node, commands
    /// routed by key slot, `MOVED`/`ASK` redirections and failovers
    /// followed by the client.
    #[cfg(feature = "redis-cluster")]
    Cluster,
    /// The master Redis Sentinel monitors, followed through failovers: one
    /// multiplexed connection to it, remade when it moves.
    #[cfg(feature = "redis-sentinel")]
    Sentinel,
}

impl Topology {
    pub(super) fn is_cluster(self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if self == Self::Cluster {
            return true;
        }
        false
    }
}

/// A `rediss://` URL without feature `redis-tls` is an error that names
/// it: the redis crate's own ("the feature is not enabled") names its
/// feature, not this crate's.
fn tls_available(urls: &[String], tls: bool) -> Result<(), RedisBackendError> {
    if !tls && urls.iter().any(|u| u.starts_with("rediss://")) {
        return Err(RedisBackendError::Unsupported(
            "rediss:// URLs need keyed-rate-limit's `redis-tls` feature",
        ));
    }
    Ok(())
}

/// The servers a backend connects to, and how.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) urls: Vec<String>,
    pub(super) topology: Topology,
    pub(super) mode: ConnectionMode,
    #[cfg(feature = "redis-tls")]
    pub(super) tls: Tls,
    /// The master to follow and its credentials (sentinel mode only).
    #[cfg(feature = "redis-sentinel")]
    pub(super) sentinel: Option<super::sentinel::Watched>,
}

impl Endpoint {
    pub(super) async fn connect(
        &self,
        mode: ConnectionMode,
        lazy: bool,
    ) -> Result<Conn, RedisBackendError> {
        let url = self.urls.first().map_or("", String::as_str);
        tls_available(&self.urls, cfg!(feature = "redis-tls"))?;
        #[cfg(feature = "redis-sentinel")]
        if self.sentinel.is_some() && self.topology != Topology::Sentinel {
            return Err(RedisBackendError::Unsupported(
                "sentinel_master_auth needs RedisBackend::sentinel_builder",
            ));
        }
        if self.topology != Topology::Single && mode != ConnectionMode::Multiplexed {
            return Err(RedisBackendError::Unsupported(
                "a cluster or sentinel backend keeps one multiplexed connection per node: no pool",
            ));
        }
        #[cfg(feature = "redis-tls")]
        let certs = self.tls.certificates();
        Ok(match (self.topology, mode) {
            (Topology::Single, ConnectionMode::Multiplexed) => {
                #[cfg(feature = "redis-tls")]
                let client = match certs {
                    Some(c) => redis::Client::build_with_tls(url, c)?,
                    None => redis::Client::open(url)?,
                };
                #[cfg(not(feature = "redis-tls"))]
                let client = redis::Client::open(url)?;
                // One attempt per reconnect, no retries: a bad URL fails the
                // build at once, and a call that finds its connection dead
                // retries once on the next attempt (`Conn::invoke`), which
                // must answer (refused, or connected) within a rule's
                // timeout; after a drop every later call starts a new
                // attempt anyway.
                // The rules' guards time every call out (`redis_timeout`,
                // patient while Redis answers pings); redis-rs's own 500 ms
                // would fail a busy but live Redis first. This only bounds
                // what runs outside a guard (start-up).
                // A refused reconnect is told within tens of milliseconds,
                // inside a rule's timeout: the breaker, not redis-rs's
                // backoff (100 ms, doubling), paces a dead server.
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(0)
                    .set_response_timeout(Some(UNGUARDED_TIMEOUT));
                Conn::Multiplexed(if lazy {
                    ConnectionManager::new_lazy_with_config(client, config)?
                } else {
                    ConnectionManager::new_with_config(client, config).await?
                })
            }
            #[cfg(feature = "redis-tls")]
            (_, ConnectionMode::Pool { .. }) if certs.is_some() => {
                return Err(RedisBackendError::Unsupported(
                    "custom TLS certificates need the multiplexed or cluster connection",
                ));
            }
            (_, ConnectionMode::Pool { max_size }) => {
                let manager = RedisConnectionManager::new(url)?;
                let pool = bb8::Pool::builder()
                    .max_size(max_size.max(1))
                    .min_idle(Some(1))
                    .retry_connection(false);
                Conn::Pool(if lazy {
                    pool.build_unchecked(manager)
                } else {
                    // The first connection is made here so a bad URL fails
                    // the build, at once rather than after bb8's 30 s of
                    // retries.
                    pool.build(manager).await?
                })
            }
            #[cfg(feature = "redis-cluster")]
            (Topology::Cluster, _) => {
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
                let cluster = super::reconnect::Reconnecting::new(move || {
                    let client = client.clone();
                    async move { client.get_async_connection().await }.boxed()
                });
                if !lazy {
                    cluster.get().await?;
                }
                Conn::Cluster(cluster)
            }
            #[cfg(feature = "redis-sentinel")]
            (Topology::Sentinel, _) => Conn::Sentinel(
                super::sentinel::connect(
                    &self.urls,
                    self.sentinel.as_ref(),
                    #[cfg(feature = "redis-tls")]
                    certs,
                    UNGUARDED_TIMEOUT,
                    lazy,
                )
                .await?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rediss_without_the_tls_feature_names_it() {
        let urls = ["rediss://redis.internal:6380".to_owned()];
        let e = super::tls_available(&urls, false).unwrap_err();
        assert!(e.to_string().contains("`redis-tls` feature"), "{e}");
        assert!(super::tls_available(&urls, true).is_ok());
        assert!(super::tls_available(&["redis://h:6379".to_owned()], false).is_ok());
    }
}
