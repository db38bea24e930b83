//! The live instance count ([`RedisBackendBuilder::live_instances`](super::RedisBackendBuilder::live_instances)):
//! every gateway's backend announces itself in one sorted set, scored by
//! when its announcement expires on Redis time, and reads how many
//! gateways announced within the TTL. `LocalFallback` divides by that
//! count, as Envoy's `local_cluster_rate_limit` does by its cluster's size.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use super::{Inner, RedisBackend, keys, script};

/// The count last read; 0 until one is.
#[derive(Debug, Default)]
pub(crate) struct LiveCount(AtomicU32);

impl LiveCount {
    /// The live gateways, once counted.
    pub(crate) fn get(&self) -> Option<u32> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    fn set(&self, n: u32) {
        self.0.store(n, Ordering::Relaxed);
    }
}

/// This gateway's membership: its id, its TTL, and the count it reads.
#[derive(Debug)]
pub(crate) struct Membership {
    pub(crate) id: String,
    pub(crate) ttl: Duration,
    pub(crate) count: Arc<LiveCount>,
}

impl Membership {
    pub(crate) fn new(ttl: Duration, id: Option<String>) -> Self {
        if let Some(id) = id {
            return Self {
                id,
                ttl,
                count: Arc::default(),
            };
        }
        // One id per process: a gateway with several backends on one Redis
        // and prefix counts once. The pid and the time of the first backend
        // (a restarted process may reuse its pid).
        static ID: OnceLock<String> = OnceLock::new();
        let id = ID.get_or_init(|| {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{}-{nanos:x}", std::process::id())
        });
        Self {
            id: id.clone(),
            ttl,
            count: Arc::default(),
        }
    }
}

/// The set every gateway on this prefix announces itself in.
pub(super) fn set_key(prefix: &str) -> Vec<u8> {
    keys::tagged_key(prefix, "instances", &crate::Key::from("*"), b"live")
}

/// One announcement; the live count, also kept for the failure mode.
pub(super) async fn announce(backend: &RedisBackend) -> Option<u32> {
    let m = backend.inner.membership.as_ref()?;
    let key = set_key(&backend.inner.prefix);
    let invocation = script::instances(key, &m.id, m.ttl, false);
    // A silent Redis must not hold the task past the next announcement.
    let reply = tokio::time::timeout(m.ttl / 3, backend.invoke::<i64>(&invocation)).await;
    let n = u32::try_from(reply.ok()?.ok()?).ok()?;
    m.count.set(n);
    Some(n)
}

/// The departure of `m` from the count, for a backend being dropped.
pub(super) fn leave(prefix: &str, m: &Membership) -> redis::ScriptInvocation<'static> {
    script::instances(set_key(prefix), &m.id, m.ttl, true)
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
