//! Global concurrency limits (feature `redis`): slots in a Redis sorted
//! set, renewed while the request lives and released when it ends.
//!
//! One task per limit renews every slot this instance holds, one Redis
//! call per key (all that key's slots at once), so holding 10,000
//! requests costs 10,000 map entries, not 10,000 tasks and timers.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;

use super::permit::{Acquire, Acquired, LocalSlots, Permit, Refused, local_only};
use crate::backend::redis::{RedisBackend, SlotOp, SlotReply};
use crate::failure::{Admit, FailureMode, Guard};
use crate::policy::Cause;
use crate::util::instant::after;
use crate::{decision::Source, key::Key};

/// A limit shared by every gateway through slots in Redis (`slot.lua`).
pub(crate) struct GlobalSlots {
    redis: RedisBackend,
    guard: Guard,
    ttl: Duration,
    /// The requests this instance holds, admitted by Redis or not: what
    /// `in_flight` reports, and what the local fallback counts against.
    local: Arc<LocalSlots>,
    /// The slots held in Redis, by key, for the renewal task.
    held: Mutex<HashMap<Key, HeldSlots>>,
    /// Whether the renewal task runs; it ends when no slot is held.
    renewing: AtomicBool,
    /// At most one renewal or release warning a second.
    warn_log: crate::observe::Sampled,
}

struct HeldSlots {
    name: Arc<str>,
    ids: HashSet<Arc<str>>,
}

/// Renewal calls in flight at once, across keys.
const RENEW_CONCURRENCY: usize = 16;

impl GlobalSlots {
    pub(super) fn new(redis: RedisBackend, guard: Guard, ttl: Duration) -> Self {
        Self {
            redis,
            guard,
            ttl,
            local: Arc::default(),
            held: Mutex::default(),
            renewing: AtomicBool::new(false),
            warn_log: crate::observe::Sampled::default(),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<Key, HeldSlots>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn register(self: &Arc<Self>, name: &Arc<str>, key: &Key, id: &Arc<str>) {
        self.held()
            .entry(key.clone())
            .or_insert_with(|| HeldSlots {
                name: name.clone(),
                ids: HashSet::new(),
            })
            .ids
            .insert(id.clone());
        if !self.renewing.swap(true, Ordering::AcqRel) {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                // The next slot registered on a runtime starts the task.
                self.renewing.store(false, Ordering::Release);
                tracing::warn!(target: crate::observe::TARGET, rule = %name,
                    "no tokio runtime to renew concurrency slots; they expire after their TTL");
                return;
            };
            rt.spawn(renew_all(Arc::downgrade(self), self.ttl / 3));
        }
    }

    /// Whether `id` was still registered (its request had not ended).
    fn unregister(&self, key: &Key, id: &Arc<str>) -> bool {
        let mut held = self.held();
        let Some(h) = held.get_mut(key) else {
            return false;
        };
        let was = h.ids.remove(id);
        if h.ids.is_empty() {
            held.remove(key);
        }
        was
    }

    /// Renews one key's slots; a slot Redis no longer holds is dropped
    /// from the renewals, loudly.
    async fn renew(&self, name: Arc<str>, key: Key, ids: Vec<Arc<str>>) {
        let call = self.redis.renew_slots(&name, &key, &ids, self.ttl);
        match self
            .guard
            .call(self.redis.reachability(), std::pin::pin!(call))
            .await
        {
            Ok(flags) => {
                for (id, held) in ids.iter().zip(flags) {
                    // Not held because its request ended meanwhile: no news.
                    if !held
                        && self.unregister(&key, id)
                        && let Some(suppressed) = self.warn_log.take(crate::observe::DENY_EVERY)
                    {
                        tracing::warn!(target: crate::observe::TARGET, rule = %name, key = %key.fingerprint(),
                            suppressed, "concurrency slot expired before it was renewed; its slot may be given away");
                    }
                }
            }
            Err(cause) => {
                if let Some(suppressed) = self.warn_log.take(crate::observe::DENY_EVERY) {
                    tracing::warn!(target: crate::observe::TARGET, rule = %name, key = %key.fingerprint(),
                        slots = ids.len(), %cause, suppressed, "cannot renew concurrency slots; retrying");
                }
            }
        }
    }

    pub(super) fn slots(&self) -> &LocalSlots {
        &self.local
    }

    /// Decides at once when the breaker is open, else returns the Redis call.
    pub(super) fn acquire_now(
        self: &Arc<Self>,
        name: &Arc<str>,
        key: Key,
        limit: u32,
        retry_hint: Duration,
    ) -> Acquire {
        if let Admit::Skip(_) = self.guard.admit() {
            return Acquire::Now(self.fail(key, limit, retry_hint, Cause::CircuitOpen));
        }
        let (g, name) = (self.clone(), name.clone());
        Acquire::Later(Box::pin(async move {
            g.acquire(name, key, limit, retry_hint).await
        }))
    }
    async fn acquire(
        self: Arc<Self>,
        name: Arc<str>,
        key: Key,
        limit: u32,
        retry_hint: Duration,
    ) -> Acquired {
        let id: Arc<str> = slot_id().into();
        let op = SlotOp::Acquire {
            id: &id,
            max_in_flight: limit,
            ttl: self.ttl,
            retry_hint,
        };
        let mut unanswered = Unanswered {
            global: &self,
            name: &name,
            key: &key,
            id: &id,
            answered: false,
        };
        let reply = self.call(&name, &key, op).await;
        unanswered.answered = reply.is_ok();
        drop(unanswered);
        let verdict = match reply {
            Ok(r) if r.ok => {
                let permit = Permit {
                    _local: self.local.take(key.clone()),
                    _slot: Some(Box::new(Slot::start(self, name, key, id))),
                };
                Ok((permit, r.in_flight))
            }
            Ok(r) => Err(Refused {
                retry_after: r.retry_after,
            }),
            Err(cause) => return self.fail(key, limit, retry_hint, cause),
        };
        Acquired {
            source: Source::Global,
            verdict,
        }
    }

    /// Decides without Redis. The local fallback allows this instance's
    /// share of `limit`.
    fn fail(&self, key: Key, limit: u32, retry_hint: Duration, cause: Cause) -> Acquired {
        let (verdict, source) = self.guard.fail_with(&key, cause, |mode| {
            let verdict = match mode {
                FailureMode::RefusePercent(p) if self.guard.partial_refuses(p) => Err(Refused {
                    retry_after: self.guard.closed_retry(),
                }),
                FailureMode::FailOpen | FailureMode::RefusePercent(_) => {
                    let permit = self.local.take(key.clone());
                    Ok((local_only(permit), self.local.held(&key)))
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
        Acquired { source, verdict }
    }

    async fn call(&self, name: &str, key: &Key, op: SlotOp<'_>) -> Result<SlotReply, Cause> {
        let call = self.redis.slot(name, key, op);
        self.guard
            .call(self.redis.reachability(), std::pin::pin!(call))
            .await
    }
}

/// Slot ids only need to be unique, not secret: a random per-process half
/// and a counter, without a random-number dependency.
fn slot_id() -> String {
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

/// Renews every slot `g` holds each `every` (TTL/3, so two renewals may
/// fail before a slot is lost), until no slot is held or `g` is gone.
async fn renew_all(g: Weak<GlobalSlots>, every: Duration) {
    let mut tick = tokio::time::interval_at(after(tokio::time::Instant::now(), every), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(g) = g.upgrade() else { return };
        let batch: Vec<(Arc<str>, Key, Vec<Arc<str>>)> = g
            .held()
            .iter()
            .map(|(k, h)| (h.name.clone(), k.clone(), h.ids.iter().cloned().collect()))
            .collect();
        if batch.is_empty() {
            g.renewing.store(false, Ordering::Release);
            // A slot registered since the snapshot saw the task running.
            if g.held().is_empty() || g.renewing.swap(true, Ordering::AcqRel) {
                return;
            }
            continue;
        }
        futures_util::stream::iter(batch)
            .for_each_concurrent(RENEW_CONCURRENCY, |(name, key, ids)| {
                g.renew(name, key, ids)
            })
            .await;
    }
}

/// A slot held in Redis: renewed while it lives, released when dropped.
pub(crate) struct Slot {
    global: Arc<GlobalSlots>,
    name: Arc<str>,
    key: Key,
    id: Arc<str>,
}

impl Slot {
    /// Registers the slot with its limit's renewal task, so a response
    /// that streams for longer than the TTL keeps its slot.
    pub(super) fn start(global: Arc<GlobalSlots>, name: Arc<str>, key: Key, id: Arc<str>) -> Self {
        global.register(&name, &key, &id);
        Self {
            global,
            name,
            key,
            id,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.global.unregister(&self.key, &self.id);
        release_later(&self.global, &self.name, &self.key, &self.id);
    }
}

/// Releases slot `id` on its own task: drop cannot await. If the release
/// fails, the TTL frees the slot.
fn release_later(g: &Arc<GlobalSlots>, name: &Arc<str>, key: &Key, id: &Arc<str>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        if let Some(suppressed) = g.warn_log.take(crate::observe::DENY_EVERY) {
            tracing::warn!(target: crate::observe::TARGET, rule = %name, suppressed,
                "no tokio runtime to release a concurrency slot; it expires after its TTL");
        }
        return;
    };
    let (g, name, key, id) = (g.clone(), name.clone(), key.clone(), id.clone());
    rt.spawn(async move {
        if let Err(cause) = g.call(&name, &key, SlotOp::Release { id: &id }).await
            && let Some(suppressed) = g.warn_log.take(crate::observe::DENY_EVERY)
        {
            tracing::warn!(target: crate::observe::TARGET, rule = %name, key = %key.fingerprint(),
                %cause, suppressed, "cannot release concurrency slot; it expires after its TTL");
        }
    });
}

/// An acquire whose answer is not in: when it ends without one (a timeout,
/// an error, or a client that went away mid-call), the script may still
/// have run, so the slot it may hold is released, not left to its TTL.
struct Unanswered<'a> {
    global: &'a Arc<GlobalSlots>,
    name: &'a Arc<str>,
    key: &'a Key,
    id: &'a Arc<str>,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            release_later(self.global, self.name, self.key, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_are_unique_128_bit_hex() {
        let (a, b) = (slot_id(), slot_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
