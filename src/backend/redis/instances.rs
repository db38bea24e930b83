//! The live instance count ([`RedisBackendBuilder::live_instances`](super::RedisBackendBuilder::live_instances)):
//! every gateway's backend announces itself in one sorted set, scored by
//! when its announcement expires on Redis time, and reads how many
//! gateways announced within the TTL. `LocalFallback` divides by that
//! count, as Envoy's `local_cluster_rate_limit` does by its cluster's size.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{Inner, RedisBackend, keys, script};

/// The count last read (0 until one is), and what the failure mode divides
/// by: a count that fell holds its old value for one TTL more, so a Redis
/// that restarted empty (the first gateway to announce again reads 1) or a
/// gateway that flaps does not hand every gateway a bigger share at once.
#[derive(Debug, Default)]
pub(crate) struct LiveCount {
    read: AtomicU32,
    /// The count before a fall, and until when it holds.
    held: Mutex<Option<(u32, Instant)>>,
}

impl LiveCount {
    /// The live gateways as last read.
    pub(crate) fn read(&self) -> Option<u32> {
        match self.read.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// What to divide by: the count read, or a higher one it fell from
    /// within the last TTL.
    pub(crate) fn get(&self) -> Option<u32> {
        let read = self.read()?;
        let held = *self.held.lock().unwrap_or_else(PoisonError::into_inner);
        Some(match held {
            Some((n, until)) if Instant::now() < until => read.max(n),
            _ => read,
        })
    }

    fn set(&self, n: u32, ttl: Duration) {
        let before = self.read.swap(n, Ordering::Relaxed);
        if n < before {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let peak = held
                .filter(|(_, until)| Instant::now() < *until)
                .map_or(before, |(m, _)| m.max(before));
            *held = Some((peak, Instant::now() + ttl));
        }
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
        // and prefix counts once.
        Self {
            id: process_id().to_owned(),
            ttl,
            count: Arc::default(),
        }
    }
}

/// This process's id: the pid and the time it was first asked for (a
/// restarted process may reuse its pid).
pub(crate) fn process_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}", std::process::id())
    })
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
    m.count.set(n, m.ttl);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fall_in_the_count_holds_for_a_ttl() {
        let ttl = Duration::from_secs(3);
        let c = LiveCount::default();
        assert_eq!(c.get(), None, "nothing read yet");
        c.set(3, ttl);
        assert_eq!(c.get(), Some(3));
        // Redis restarted empty: this gateway announces first.
        c.set(1, ttl);
        assert_eq!((c.read(), c.get()), (Some(1), Some(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        c.set(2, ttl);
        assert_eq!(c.get(), Some(3), "still within the first fall's TTL");
        tokio::time::advance(ttl).await;
        assert_eq!(c.get(), Some(2), "a TTL after the last fall");
        c.set(4, ttl);
        assert_eq!(c.get(), Some(4), "a rise counts at once");
    }
}
