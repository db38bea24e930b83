//! The pinger behind [`Reachability`](crate::failure::Reachability): a
//! thread with its own runtime and connection, so it hears the server even
//! when the gateway's runtime is too busy to read its own replies.

use std::thread::Thread;
use std::time::Duration;

use super::conn::ping;
use super::endpoint::{ConnectionMode, Endpoint};
use crate::failure::Heard;

/// Between pings while a call waits past its timeout.
const EVERY: Duration = Duration::from_millis(2);
/// A ping unanswered this long is dropped; the next one asks again.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// Between connection attempts while the server is down.
const RECONNECT: Duration = Duration::from_millis(100);

pub(super) fn start(endpoint: Endpoint, heard: Heard) -> std::io::Result<Thread> {
    // The pool's checkout ping is not this ping: one multiplexed connection.
    let mode = match endpoint.mode {
        ConnectionMode::Pool { .. } => ConnectionMode::Multiplexed,
        mode => mode,
    };
    let handle = std::thread::Builder::new()
        .name("krl-redis-pinger".into())
        .spawn(move || {
            // Built here, not by the caller: a runtime must not be dropped
            // on another runtime's worker, as it would be if the spawn failed.
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(target: crate::observe::TARGET, error = %e, "cannot start the redis pinger's runtime");
                    return;
                }
            };
            let mut conn = None;
            let mut idle = true;
            while let Some(wanted) = heard.wanted() {
                if !wanted {
                    idle = true;
                    std::thread::park_timeout(Duration::from_secs(1));
                    continue;
                }
                // A cluster PING reaches the primaries the connection knows;
                // a failover since it connected may have made others. So a
                // cluster pinger starts each spell of pinging on a fresh view.
                if std::mem::take(&mut idle) && endpoint.topology.is_cluster() {
                    conn = None;
                }
                let pause = rt.block_on(async {
                    if conn.is_none() {
                        // A stopped seed node must not hang the pinger.
                        let connect = endpoint.connect(mode, false);
                        conn = tokio::time::timeout(PING_TIMEOUT, connect).await.ok().and_then(Result::ok);
                    }
                    let Some(c) = &conn else { return RECONNECT };
                    if let Ok(Ok(())) = tokio::time::timeout(PING_TIMEOUT, ping(c)).await {
                        heard.pong();
                    }
                    EVERY
                });
                std::thread::sleep(pause);
            }
        })?;
    Ok(handle.thread().clone())
}
