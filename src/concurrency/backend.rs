//! Where in-flight counts live: in this process, or as leases in Redis.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use tokio::task::AbortHandle;

use crate::backend::redis::{LeaseOp, RedisBackend};
use crate::failure::{Admit, Cause, FailureMode, Guard};
use crate::{Key, Source};

/// The store of in-flight counts. An enum rather than a trait object so the
/// local hot path is a plain match; only the Redis variant awaits.
#[derive(Clone)]
pub(crate) enum Backend {
    Local(Arc<LocalSlots>),
    Redis(Arc<Global>),
}

/// A limit shared by every gateway through leases in Redis (`lease.lua`).
pub(crate) struct Global {
    redis: RedisBackend,
    guard: Guard,
    ttl: Duration,
    /// The requests this instance holds, admitted by Redis or not: what
    /// `in_flight` reports, and what the local fallback counts against.
    local: Arc<LocalSlots>,
}

/// A held slot; dropping it frees the slot, whatever ends the request.
pub(crate) struct Permit {
    _local: LocalPermit,
    _lease: Option<Lease>,
}

/// What an acquire decided, and who decided it.
pub(crate) struct Outcome {
    pub(crate) source: Source,
    /// The permit and the count with it, or the refusal.
    pub(crate) verdict: Result<(Permit, u32), Refused>,
}

pub(crate) struct Refused {
    pub(crate) retry_after: Duration,
}

pub(crate) enum Acquire {
    Ready(Outcome),
    Pending(BoxFuture<'static, Outcome>),
}

impl Backend {
    pub(crate) fn local() -> Self {
        Self::Local(Arc::new(LocalSlots::default()))
    }

    pub(crate) fn redis(redis: RedisBackend, guard: Guard, ttl: Duration) -> Self {
        Self::Redis(Arc::new(Global {
            redis,
            guard,
            ttl,
            local: Arc::default(),
        }))
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
        match self {
            Self::Local(slots) => Acquire::Ready(Outcome {
                source: Source::Local,
                verdict: slots.try_acquire(key, limit, retry_hint),
            }),
            Self::Redis(g) => {
                if let Admit::Skip(_) = g.guard.admit() {
                    return Acquire::Ready(g.fail(key, limit, retry_hint, Cause::CircuitOpen));
                }
                let (g, name) = (g.clone(), name.clone());
                Acquire::Pending(Box::pin(async move {
                    g.acquire(name, key, limit, retry_hint).await
                }))
            }
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
            Self::Redis(g) => &g.local,
        }
    }
}

impl Global {
    async fn acquire(
        self: Arc<Self>,
        name: Arc<str>,
        key: Key,
        limit: u32,
        retry_hint: Duration,
    ) -> Outcome {
        let id = lease_id();
        let op = LeaseOp::Acquire {
            id: &id,
            max_in_flight: limit,
            ttl: self.ttl,
            retry_hint,
        };
        // A timeout may leave a lease acquired that no permit owns; it
        // expires after its TTL.
        match self
            .guard
            .call(self.redis.liveness(), self.redis.lease(&name, &key, op))
            .await
        {
            Ok(r) if r.ok => {
                let local = self.local.take(key.clone());
                let lease = Lease::start(self, name, key, id);
                Outcome {
                    source: Source::Global,
                    verdict: Ok((
                        Permit {
                            _local: local,
                            _lease: Some(lease),
                        },
                        r.in_flight,
                    )),
                }
            }
            Ok(r) => Outcome {
                source: Source::Global,
                verdict: Err(Refused {
                    retry_after: r.retry_after,
                }),
            },
            Err(cause) => self.fail(key, limit, retry_hint, cause),
        }
    }

    /// Decides without Redis. The local fallback allows this instance's
    /// share of `limit`.
    fn fail(&self, key: Key, limit: u32, retry_hint: Duration, cause: Cause) -> Outcome {
        let (verdict, source) = self.guard.fail_with(&key, cause, |mode| {
            let verdict = match mode {
                FailureMode::FailOpen => {
                    let permit = self.local.take(key.clone());
                    let held = self.local.held(&key);
                    Ok((local_only(permit), held))
                }
                FailureMode::FailClosed => Err(Refused {
                    retry_after: self.guard.closed_retry(),
                }),
                FailureMode::LocalFallback => {
                    let share = self.guard.local_share(limit);
                    self.local.try_acquire(key.clone(), share, retry_hint)
                }
            };
            let allowed = verdict.is_ok();
            (verdict, allowed)
        });
        Outcome { source, verdict }
    }

    async fn call(&self, name: &str, key: &Key, op: LeaseOp<'_>) -> Result<bool, Cause> {
        let reply = self
            .guard
            .call(self.redis.liveness(), self.redis.lease(name, key, op))
            .await?;
        Ok(reply.ok)
    }
}

fn local_only(local: LocalPermit) -> Permit {
    Permit {
        _local: local,
        _lease: None,
    }
}

/// Lease ids only need to be unique, not secret: a random per-process half
/// and a counter, without a random-number dependency.
fn lease_id() -> String {
    static NONCE: LazyLock<u64> = LazyLock::new(|| {
        RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:016x}{:016x}",
        *NONCE,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A lease held in Redis: renewed while it lives, released when dropped.
struct Lease {
    global: Arc<Global>,
    name: Arc<str>,
    key: Key,
    id: Arc<str>,
    renewal: AbortHandle,
}

impl Lease {
    /// Starts renewing every TTL/3, so a response that streams for longer
    /// than the TTL keeps its slot; two renewals may fail before it is lost.
    fn start(global: Arc<Global>, name: Arc<str>, key: Key, id: String) -> Self {
        let id: Arc<str> = id.into();
        let renewal = tokio::spawn(renew(global.clone(), name.clone(), key.clone(), id.clone()))
            .abort_handle();
        Self {
            global,
            name,
            key,
            id,
            renewal,
        }
    }
}

async fn renew(g: Arc<Global>, name: Arc<str>, key: Key, id: Arc<str>) {
    let every = g.ttl / 3;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let op = LeaseOp::Renew {
            id: &id,
            ttl: g.ttl,
        };
        match g.call(&name, &key, op).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(target: "keyed_rate_limit", rule = %name, key = %key.fingerprint(),
                    "concurrency lease expired before it was renewed; its slot may be given away");
                return;
            }
            Err(cause) => {
                tracing::warn!(target: "keyed_rate_limit", rule = %name, key = %key.fingerprint(),
                    %cause, "cannot renew concurrency lease; retrying");
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
        // Drop cannot await: the release runs on its own, and if it fails
        // the TTL frees the slot.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(target: "keyed_rate_limit", rule = %self.name,
                "no tokio runtime to release a concurrency lease; it expires after its TTL");
            return;
        };
        let (g, name, key, id) = (
            self.global.clone(),
            self.name.clone(),
            self.key.clone(),
            self.id.clone(),
        );
        rt.spawn(async move {
            if let Err(cause) = g.call(&name, &key, LeaseOp::Release { id: &id }).await {
                tracing::warn!(target: "keyed_rate_limit", rule = %name, key = %key.fingerprint(),
                    %cause, "cannot release concurrency lease; it expires after its TTL");
            }
        });
    }
}

/// Per-key counts of requests in flight. A key is removed when its last
/// request ends, so memory is bounded by what is in flight, with no sweep.
#[derive(Default)]
pub(crate) struct LocalSlots {
    counts: DashMap<Key, u32>,
}

/// A slot in [`LocalSlots`], freed on drop.
struct LocalPermit {
    slots: Arc<LocalSlots>,
    key: Key,
}

impl Drop for LocalPermit {
    fn drop(&mut self) {
        self.slots.release(&self.key);
    }
}

impl LocalSlots {
    fn try_acquire(
        self: &Arc<Self>,
        key: Key,
        limit: u32,
        retry_after: Duration,
    ) -> Result<(Permit, u32), Refused> {
        let held = self
            .count(&key, limit)
            .map_err(|_| Refused { retry_after })?;
        let permit = LocalPermit {
            slots: self.clone(),
            key,
        };
        Ok((local_only(permit), held))
    }

    /// Counts a request already admitted elsewhere.
    fn take(self: &Arc<Self>, key: Key) -> LocalPermit {
        let _ = self.count(&key, u32::MAX);
        LocalPermit {
            slots: self.clone(),
            key,
        }
    }

    fn held(&self, key: &Key) -> u32 {
        self.counts.get(key).map_or(0, |n| *n)
    }

    fn count(&self, key: &Key, limit: u32) -> Result<u32, u32> {
        // The entry holds its shard's lock: check and increment are one step.
        let mut n = self.counts.entry(key.clone()).or_insert(0);
        if *n >= limit {
            return Err(*n);
        }
        *n += 1;
        Ok(*n)
    }

    fn release(&self, key: &Key) {
        self.counts.remove_if_mut(key, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(b: &Backend, key: &Key, limit: u32) -> Result<(Permit, u32), Duration> {
        let name: Arc<str> = "t".into();
        match b.acquire(&name, key.clone(), limit, Duration::from_secs(1)) {
            Acquire::Ready(o) => o.verdict.map_err(|r| r.retry_after),
            Acquire::Pending(_) => panic!("local acquire never awaits"),
        }
    }

    #[test]
    fn admits_up_to_the_limit_and_forgets_idle_keys() {
        let b = Backend::local();
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

    #[test]
    fn lease_ids_are_unique_128_bit_hex() {
        let (a, b) = (lease_id(), lease_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
