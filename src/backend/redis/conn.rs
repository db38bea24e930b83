//! The connection every script and command takes: `EVALSHA` with the
//! reload after `NOSCRIPT`, on one multiplexed connection, a pool or a
//! cluster.

#[cfg(feature = "redis-cluster")]
use std::sync::Arc;

use bb8_redis::{RedisConnectionManager, bb8};
use redis::aio::ConnectionManager;
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;

use super::error::RedisBackendError;
#[cfg(feature = "redis-cluster")]
use super::reconnect::Reconnecting;
use super::script::Eval;
use crate::failure::Reachability;

/// Extra `EVALSHA`/`SCRIPT LOAD` rounds after the redis crate's own one.
/// Each round is lost only when a flush lands between its load and its
/// call, so a few more rounds cost nothing until Redis forgets its scripts
/// (5 lost 5 of 600 decisions to a `SCRIPT FLUSH` every 2 ms on a busy
/// 2-core machine); the layer's timeout still bounds the whole.
const NOSCRIPT_ROUNDS: u32 = 20;

/// A script call: through the client's invocation (which loads the script
/// itself after `NOSCRIPT`), or written straight into its command
/// ([`Eval`]), loaded here from its source.
#[derive(Clone, Copy)]
pub(super) enum Call<'a> {
    Invocation(&'a redis::ScriptInvocation<'a>),
    Eval(&'a Eval),
}

impl Call<'_> {
    async fn send<T, C>(self, conn: &mut C) -> redis::RedisResult<T>
    where
        T: redis::FromRedisValue,
        C: redis::aio::ConnectionLike + Send,
    {
        match self {
            Call::Invocation(invocation) => invocation.invoke_async(conn).await,
            Call::Eval(eval) => eval.cmd.query_async(conn).await,
        }
    }
}

#[derive(Clone)]
pub(super) enum Conn {
    Multiplexed(ConnectionManager),
    Pool(bb8::Pool<RedisConnectionManager>),
    /// Connected in the background: at once, or lazily.
    #[cfg(feature = "redis-cluster")]
    Cluster(Arc<Reconnecting<ClusterConnection>>),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(super::sentinel::Master),
}

/// `PING`, on every master of a cluster.
pub(super) async fn ping(conn: &Conn) -> Result<(), RedisBackendError> {
    conn.query::<redis::Value>(&redis::cmd("PING"))
        .await
        .map(drop)
}

impl Conn {
    /// See [`RedisBackend::invoke`]; replies count as heard on `reachability`.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        reachability: Option<&Reachability>,
        call: Call<'_>,
    ) -> Result<T, RedisBackendError> {
        let (mut rounds, mut retried) = (0, false);
        loop {
            let reply = match self {
                Conn::Multiplexed(conn) => call.send(&mut conn.clone()).await,
                Conn::Pool(pool) => call.send(&mut *pool.get().await?).await,
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(c) => match c.get().await {
                    Ok((mut conn, _)) => call.send(&mut conn).await,
                    Err(e) => Err(e),
                },
                #[cfg(feature = "redis-sentinel")]
                Conn::Sentinel(m) => {
                    super::sentinel::on_master(m, async |c| call.send(c).await).await
                }
            };
            // A cluster's replies come from whichever node owns the key, so
            // they prove nothing of a silent one: there only the pinger's
            // PING, which every primary must answer, counts.
            if let Some(reachability) = reachability
                && !self.is_cluster()
                && !reply.as_ref().is_err_and(|e| e.is_io_error())
            {
                reachability.heard();
            }
            match reply {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                        && rounds < NOSCRIPT_ROUNDS =>
                {
                    rounds += 1;
                    if let Call::Eval(eval) = call {
                        let mut load = redis::cmd("SCRIPT");
                        load.arg("LOAD").arg(eval.source);
                        self.query::<redis::Value>(&load).await?;
                    }
                }
                // A connection found dead (Redis restarted while this one
                // was idle, or a reconnect failed while it was down): once
                // more, on the fresh one the client makes meanwhile, so the
                // first call after an outage is Redis's. The rule's timeout
                // bounds both; a call lost mid-reply may count twice, never
                // admit twice. A cluster retries on its own.
                Err(e) if e.is_connection_dropped() && !retried && !self.is_cluster() => {
                    retried = true;
                }
                reply => return Ok(reply?),
            }
        }
    }

    pub(super) fn is_cluster(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if let Conn::Cluster(_) = self {
            return true;
        }
        false
    }

    /// One command on whichever connection this is (a cluster routes it).
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisBackendError> {
        Ok(match self {
            Conn::Multiplexed(conn) => cmd.query_async(&mut conn.clone()).await?,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => cmd.query_async(&mut c.get().await?.0).await?,
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(m) => {
                super::sentinel::on_master(m, async |c| cmd.query_async(c).await).await?
            }
            Conn::Pool(pool) => cmd.query_async(&mut *pool.get().await?).await?,
        })
    }
}
