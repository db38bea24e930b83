//! The live instance count ([`RedisBackendBuilder::live_instances`](super::RedisBackendBuilder::live_instances)):
//! every gateway's backend announces itself in one sorted set, scored by
//! when its announcement expires on Redis time, and reads how many
//! gateways announced within the TTL. `LocalFallback` divides by that
//! count, as Envoy's `local_cluster_rate_limit` does by its cluster's size.

use std::sync::Weak;
use std::time::Duration;

use super::backend::{Inner, RedisBackend};
use super::membership::set_key;
use super::script;

/// One announcement; the live count, also kept for the failure mode.
pub(super) async fn announce(backend: &RedisBackend) -> Option<u32> {
    let m = backend.inner.membership.as_ref()?;
    let invocation = script::instances(set_key(&backend.inner.prefix), &m.id, m.ttl, false);
    // A silent Redis must not hold the task past the next announcement.
    let reply = tokio::time::timeout(m.ttl / 3, backend.invoke::<i64>(&invocation)).await;
    let n = u32::try_from(reply.ok()?.ok()?).ok()?;
    m.count.set(n, m.ttl);
    Some(n)
}

/// Announces every third of the TTL until the backend is dropped, then
/// leaves the set.
pub(super) fn start(inner: Weak<Inner>, ttl: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = inner.upgrade() else { break };
            announce(&RedisBackend { inner }).await;
        }
    });
}
