//! Redis Sentinel: the master is asked of the sentinels, at start and
//! again whenever a call says it may have moved, and is never assumed.
//!
//! redis-rs asks the sentinels in turn (so one down is skipped) and checks
//! that the node they name calls itself master (`ROLE`) before it hands out
//! a client. It does not follow a failover on its own, so the connection
//! to the master is a plain multiplexed one, which never reconnects by
//! itself: a redis-rs `ConnectionManager` would reconnect to the old
//! address, and an old master restarted there answers as a master until
//! the sentinels demote it.

use std::sync::Arc;

use futures_util::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisError};

use super::error::RedisBackendError;
use super::reconnect::{Abandoned, Reconnecting};

/// The master a sentinel backend follows, and how to log in to it.
#[derive(Clone, Default)]
pub(super) struct Watched {
    pub(super) master_name: String,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

/// The connection to the current master.
pub(super) type Master = Arc<Reconnecting<MultiplexedConnection>>;

/// A follower of `target` as `sentinels` name it, whose calls outside a
/// rule's guard give up after `timeout`; connected at once unless `lazy`.
pub(super) async fn connect(
    sentinels: &[String],
    target: Option<&Watched>,
    #[cfg(feature = "redis-tls")] certs: Option<redis::TlsCertificates>,
    timeout: std::time::Duration,
    lazy: bool,
) -> Result<Master, RedisBackendError> {
    let target =
        target
            .filter(|t| !t.master_name.is_empty())
            .ok_or(RedisBackendError::Unsupported(
                "a sentinel backend needs the monitored master's name",
            ))?;
    if sentinels.is_empty() {
        return Err(RedisBackendError::Unsupported(
            "a sentinel backend needs at least one sentinel URL",
        ));
    }
    let mut addrs = Vec::new();
    let mut sentinel_auth = None;
    for url in sentinels {
        let info = url.as_str().into_connection_info()?;
        let redis = info.redis_settings();
        if sentinel_auth.is_none() && redis.password().is_some() {
            sentinel_auth = Some((
                redis.username().map(str::to_owned),
                redis.password().map(str::to_owned),
            ));
        }
        addrs.push(info.addr().clone());
    }
    let tls = addrs
        .iter()
        .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
    let mut builder =
        SentinelClientBuilder::new(addrs, &target.master_name, SentinelServerType::Master)?;
    if let Some((user, password)) = sentinel_auth {
        if let Some(u) = user {
            builder = builder.set_client_to_sentinel_username(u);
        }
        if let Some(p) = password {
            builder = builder.set_client_to_sentinel_password(p);
        }
    }
    if let Some(u) = &target.username {
        builder = builder.set_client_to_redis_username(u);
    }
    if let Some(p) = &target.password {
        builder = builder.set_client_to_redis_password(p);
    }
    if tls {
        // The data nodes speak TLS when the sentinels do.
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    }
    #[cfg(feature = "redis-tls")]
    if let Some(certs) = certs {
        builder = builder
            .set_client_to_sentinel_certificates(certs.clone())
            .set_client_to_redis_certificates(certs);
    }
    let client = Arc::new(tokio::sync::Mutex::new(builder.build()?));
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let master = Reconnecting::new(move || {
        let (client, config) = (client.clone(), config.clone());
        async move {
            // One lookup at a time; it asks the sentinels in turn.
            let found = client.lock().await.async_get_client().await?;
            found
                .get_multiplexed_async_connection_with_config(&config)
                .await
        }
        .boxed()
    });
    if !lazy {
        master.get().await?;
    }
    Ok(master)
}

/// Whether `e` says the master may have moved: the connection is gone or
/// refused, or the node is (now) a replica.
fn moved(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

/// Runs `call` on the current master; a failure that says it moved makes
/// the next call ask the sentinels, an abandoned call makes them be asked
/// in the background.
pub(super) async fn on_master<T, F>(master: &Master, call: F) -> Result<T, RedisError>
where
    F: AsyncFnOnce(&mut MultiplexedConnection) -> Result<T, RedisError>,
{
    let (mut conn, n) = master.get().await?;
    let mut abandoned = Abandoned {
        on: master,
        n,
        finished: false,
    };
    let reply = call(&mut conn).await;
    abandoned.finished = true;
    if let Err(e) = &reply
        && moved(e)
    {
        master.forget(n);
    }
    reply
}
