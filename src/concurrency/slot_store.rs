//! Where in-flight counts live: in this process, or as slots in Redis.

use std::sync::Arc;
use std::time::Duration;

use super::permit::{Acquire, Acquired, LocalSlots};
#[cfg(feature = "redis")]
use super::slot::GlobalSlots;
#[cfg(feature = "redis")]
use crate::backend::redis::RedisBackend;
#[cfg(feature = "redis")]
use crate::failure::Guard;
use crate::{decision::Source, key::Key};

/// The store of in-flight counts. An enum rather than a trait object so the
/// local hot path is a plain match; only the Redis variant awaits.
#[derive(Clone)]
pub(crate) enum SlotStore {
    Local(Arc<LocalSlots>),
    #[cfg(feature = "redis")]
    Redis(Arc<GlobalSlots>),
}

impl SlotStore {
    pub(crate) fn local() -> Self {
        Self::Local(Arc::new(LocalSlots::default()))
    }

    #[cfg(feature = "redis")]
    pub(crate) fn redis(redis: RedisBackend, guard: Guard, ttl: Duration) -> Self {
        Self::Redis(Arc::new(GlobalSlots::new(redis, guard, ttl)))
    }

    /// Takes a slot of `name` for `key` when fewer than `limit` are held;
    /// a refusal asks for `retry_hint` (Redis may say sooner).
    pub(crate) fn acquire(
        &self,
        name: &Arc<str>,
        key: Key,
        limit: u32,
        retry_hint: Duration,
    ) -> Acquire {
        #[cfg(not(feature = "redis"))]
        let _ = name;
        match self {
            Self::Local(slots) => Acquire::Now(Acquired {
                source: Source::Local,
                verdict: slots.try_acquire(key, limit, retry_hint),
            }),
            #[cfg(feature = "redis")]
            Self::Redis(g) => g.acquire_now(name, key, limit, retry_hint),
        }
    }

    pub(crate) fn in_flight(&self, key: &Key) -> u32 {
        self.slots().counts.get(key).map_or(0, |n| *n)
    }

    pub(crate) fn keys(&self) -> usize {
        self.slots().counts.len()
    }

    fn slots(&self) -> &LocalSlots {
        match self {
            Self::Local(slots) => slots,
            #[cfg(feature = "redis")]
            Self::Redis(g) => g.slots(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::concurrency::permit::Permit;

    fn take(b: &SlotStore, key: &Key, limit: u32) -> Result<(Permit, u32), Duration> {
        let name: Arc<str> = "t".into();
        match b.acquire(&name, key.clone(), limit, Duration::from_secs(1)) {
            Acquire::Now(o) => o.verdict.map_err(|r| r.retry_after),
            Acquire::Later(_) => panic!("local acquire never awaits"),
        }
    }

    #[test]
    fn admits_up_to_the_limit_and_forgets_idle_keys() {
        let b = SlotStore::local();
        let k = Key::from("acct");
        let (p1, n1) = take(&b, &k, 2).unwrap();
        let (p2, n2) = take(&b, &k, 2).unwrap();
        assert_eq!((n1, n2), (1, 2));
        assert_eq!(take(&b, &k, 2).err(), Some(Duration::from_secs(1)));
        let (_other, _) = take(&b, &Key::from("other"), 2).unwrap();
        assert_eq!(b.keys(), 2);
        drop(p1);
        assert_eq!(b.in_flight(&k), 1);
        let (p3, n3) = take(&b, &k, 2).unwrap();
        assert_eq!(n3, 2);
        drop((p2, p3));
        assert_eq!(b.in_flight(&k), 0);
        assert_eq!(b.keys(), 1, "an idle key is removed");
    }
}
