//! A global rule's runtime (feature `redis`), and the path of its
//! decisions: a lease, a cached deny or an open breaker's failure mode when
//! one can answer; otherwise one exact script call under the rule's guard,
//! alone or coalesced (a lease's grant is in `lease.rs`).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::coalesce::{Batch, Join, Leader, Queues};
use crate::backend::redis::{Decided, Locking, MAX_PREVIOUS, RedisBackend, Shard, Target};
use crate::failure::PATIENCE;
use crate::failure::{Admit, BreakerStatus, Guard};
use crate::policy::ControlOp;
use crate::policy::{Cause, QuotaChange};
use crate::rule::Rule;
use crate::store::deny_cache::DenyCache;
use crate::store::keyspace::{Budget, KeySpaceFull};
use crate::store::learned::Learned;
use crate::store::leases::{Leases, Take, Unspent, Woken};
use crate::store::local::LocalStore;
use crate::store::lock::Locks;
use crate::{decision::Decision, decision::Source, key::Key, observe, quota::Quota};

pub(super) struct Global {
    pub(super) redis: RedisBackend,
    pub(super) guard: Guard,
    pub(super) denies: DenyCache,
    /// What `LocalFallback` counts in: this instance's share of each quota.
    pub(super) fallback: LocalStore,
    /// What Redis last answered for each key, which the fallback starts
    /// the key from.
    pub(super) learned: Learned,
    /// This rule's leases on this gateway, when it leases.
    pub(super) leases: Option<Arc<Leases>>,
    /// This rule instance's name among a key's lease holders.
    pub(super) holder: String,
    /// A leasing rule's static quota, and the quota its leases are
    /// counted in.
    pub(super) counted: Option<Quotas>,
    /// Requests queued behind their group's call in flight, when the rule
    /// coalesces.
    pub(super) queues: Option<Arc<Queues<Group, Answer>>>,
    /// For giving leases back when dropped.
    pub(super) rule: (Arc<str>, crate::algorithm::Algorithm, Duration),
    /// At most one unsettled-units line a second.
    pub(super) settle_log: observe::Sampled,
    /// Set when a reload changed the rule's static quota, or the fleet's
    /// record shows older quotas in play.
    pub(super) previous: std::sync::RwLock<Option<Converting>>,
    /// Set once this rule's quota is in the fleet's record.
    pub(super) fleet: tokio::sync::OnceCell<()>,
    /// The rule has a static quota (a `quota_fn` rule's calendar counts
    /// stay as they are when its plan changes).
    pub(super) fixed: bool,
}

/// What a reload, or the fleet's record, left a global rule converting from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Converting {
    /// Each previous quota, as Redis counted it, most recent first, with
    /// until when a state under it may still matter.
    pub(super) from: [Option<(Quota, std::time::Instant)>; MAX_PREVIOUS],
    /// The quota Redis counts now.
    pub(super) to: Quota,
    pub(super) how: QuotaChange,
    /// The reload, in seconds since the epoch.
    pub(super) at: i64,
}

/// A request's quota as the rule shows it, and as Redis counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Quotas {
    /// The rule's quota: the failure mode decides in it.
    pub(super) shown: Quota,
    /// The quota Redis decides in: beside leases, the leases' (the burst
    /// held back), so that an exact decision keeps their bound; otherwise
    /// the rule's.
    pub(super) counted: Quota,
}

impl Quotas {
    /// A quota Redis counts as it is.
    fn same(quota: Quota) -> Self {
        Self {
            shown: quota,
            counted: quota,
        }
    }
}

/// What [`Global::decide_now`] leaves to Redis.
pub(super) enum Asked {
    /// One exact decision.
    Exact(Quotas),
    /// A lease (boxed: it moves into a boxed future anyway).
    Lease(Box<(Take, Quotas)>),
}

/// The most requests one script call decides.
const MAX_BATCH: usize = 128;

/// The requests one script call may decide together: one quota, and on a
/// cluster one slot.
type Group = (Quota, Shard);

/// A queued request's decision, or why Redis gave none.
pub(super) type Answer = Result<Decided, Cause>;

impl Global {
    pub(super) fn new(rule: &Rule, redis: RedisBackend, instances: u32) -> Self {
        let live = redis.live_count();
        // Several rule instances (layers) of one process each hold leases.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let keys = rule.key_space;
        Self {
            redis,
            guard: Guard::new(rule.name.clone(), rule.failure, instances, live),
            denies: DenyCache::new(Budget::new(keys.max_keys, KeySpaceFull::Refuse)),
            fallback: LocalStore::new(None, Budget::new(keys.max_keys, keys.on_key_space_full)),
            learned: Learned::new(Budget::new(keys.max_keys, KeySpaceFull::Refuse)),
            leases: rule
                .global
                .lease
                .map(|l| Leases::new(l, keys.max_keys, rule.algorithm.has_burst())),
            holder: format!("{}.{n}", crate::backend::redis::process_id()),
            counted: rule.global.lease.and_then(|l| {
                let shown = rule.static_quota()?;
                let counted = l.counted(shown, rule.algorithm)?;
                Some(Quotas { shown, counted })
            }),
            queues: rule.global.coalesce.then(Queues::new),
            rule: (
                rule.name.clone(),
                rule.algorithm,
                rule.failure.timeout.saturating_mul(PATIENCE),
            ),
            settle_log: observe::Sampled::default(),
            previous: std::sync::RwLock::new(None),
            fleet: tokio::sync::OnceCell::new(),
            fixed: rule.static_quota().is_some(),
        }
    }

    pub(super) fn breaker_status(&self) -> BreakerStatus {
        self.guard.breaker_status()
    }

    /// Keys held here: fallback shares, Redis's last answers, cached
    /// denies and leases.
    pub(super) fn len(&self) -> usize {
        let leases = self.leases.as_ref().map_or(0, |l| l.len());
        self.fallback.len() + self.learned.len() + self.denies.len() + leases
    }

    pub(super) fn cleanup(self: &Arc<Self>, rule: &Rule) {
        if self.fixed
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // The entry lasts past a few sweeps; the conversion follows
            // the fleet's.
            let (this, rule) = (self.clone(), rule.clone());
            rt.spawn(async move { this.enter(&rule).await });
        }
        self.fallback.cleanup();
        self.learned.cleanup();
        self.denies.cleanup();
        if let Some(leases) = &self.leases {
            for unspent in leases.sweep() {
                self.give_back(rule, unspent);
            }
        }
    }

    /// The quota Redis counts `quota` in when this rule leases it.
    pub(super) fn counted(&self, rule: &Rule, quota: Quota) -> Option<Quota> {
        let leases = self.leases.as_ref()?;
        match self.counted {
            Some(q) if q.shown == quota => Some(q.counted),
            _ => leases.policy().counted(quota, rule.algorithm),
        }
    }

    /// The quota Redis decides `quota` in: the leases' for a leasing rule,
    /// so that an exact decision beside leases keeps their bound.
    pub(super) fn counting(&self, rule: &Rule, quota: Quota) -> Quota {
        self.counted(rule, quota).unwrap_or(quota)
    }

    /// Decides without Redis when it can: from a lease, a cached deny, or
    /// an open breaker's failure mode. `Err` says what to ask Redis.
    pub(super) fn decide_now(
        &self,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Result<(Decision, Source), Asked> {
        if let Some(leases) = &self.leases
            && let Some(counted) = self.counted(rule, quota)
        {
            // A cost above the leases' burst never fits.
            if cost.get() > rule.algorithm.capacity(&counted) {
                let d = Decision::never(quota.limit(), quota.window());
                return Ok((d, Source::Global));
            }
            let quotas = Quotas {
                shown: quota,
                counted,
            };
            match leases.take(key, counted, quota, cost.get()) {
                Take::Spent(d) => return Ok((d, Source::Leased)),
                Take::Denied(d) => return Ok((d, Source::Global)),
                Take::Exact => return self.exact_now(rule, locks, key, quotas, cost),
                take => return Err(Asked::Lease(Box::new((take, quotas)))),
            }
        }
        self.exact_now(rule, locks, key, Quotas::same(quota), cost)
    }

    /// An exact decision without Redis when one can be made: a cached
    /// deny, or an open breaker's failure mode.
    fn exact_now(
        &self,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        quotas: Quotas,
        cost: NonZeroU32,
    ) -> Result<(Decision, Source), Asked> {
        let counted = quotas.counted;
        let smooth = rule.algorithm.has_burst() && counted.period().is_none();
        if let Some(d) = self
            .denies
            .get(key, counted, cost, smooth)
            .filter(|_| caches_denies(rule))
        {
            return Ok((d, Source::Global));
        }
        if let Admit::Skip(_) = self.guard.admit() {
            return Ok(self.fail(locks, key, quotas.shown, cost, Cause::CircuitOpen));
        }
        Err(Asked::Exact(quotas))
    }

    /// What `decide_now` left to Redis, under the rule's timeout; failures
    /// go to the failure mode.
    pub(super) async fn ask(
        self: &Arc<Self>,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        cost: NonZeroU32,
        pending: Asked,
    ) -> (Decision, Source) {
        let (mut take, quotas) = match pending {
            Asked::Exact(quotas) => return self.ask_exact(rule, locks, key, quotas, cost).await,
            Asked::Lease(lease) => *lease,
        };
        let Some(leases) = &self.leases else {
            return self.ask_exact(rule, locks, key, quotas, cost).await;
        };
        let Quotas { shown, counted } = quotas;
        loop {
            take = match take {
                Take::Spent(d) => return (d, Source::Leased),
                Take::Denied(d) => return (d, Source::Global),
                Take::Exact => {
                    return match self.exact_now(rule, locks, key, quotas, cost) {
                        Ok(decided) => decided,
                        Err(_) => self.ask_exact(rule, locks, key, quotas, cost).await,
                    };
                }
                Take::Ask(flight) => {
                    // Boxed: a grant is once a lease, and its future would
                    // make every exact decision's larger (and copied).
                    return Box::pin(self.grant(rule, locks, key, quotas, cost, flight)).await;
                }
                Take::Wait(woken) => {
                    if woken.await == Ok(Woken::Failed) {
                        return self.fail(locks, key, shown, cost, Cause::Waited);
                    }
                    leases.take(key, counted, shown, cost.get())
                }
            };
        }
    }

    /// One exact Redis decision, and what it leaves ([`answered`](Self::answered)).
    async fn ask_exact(
        self: &Arc<Self>,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        quotas: Quotas,
        cost: NonZeroU32,
    ) -> (Decision, Source) {
        let answer = self.call_exact(rule, key, quotas.counted, cost).await;
        self.answered(rule, locks, key, quotas, cost, answer)
    }

    /// An exact decision's answer: the deny cache and the key's lock learn
    /// from it, and a failure goes to the failure mode.
    pub(super) fn answered(
        &self,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        quotas: Quotas,
        cost: NonZeroU32,
        answer: Answer,
    ) -> (Decision, Source) {
        let name = &rule.name;
        match answer {
            Ok(Decided {
                decision,
                locked: true,
                lock_started,
                ..
            }) => {
                // Held here for a while: no Redis call per request while
                // locked, and an unblock elsewhere is seen within a second.
                let left = decision.retry_after().unwrap_or_default();
                let within = rule.lock_policy.within();
                locks.block(key, left, true, within);
                if lock_started {
                    observe::locked(name, &key.fingerprint(), left);
                }
                (decision, Source::Locked)
            }
            Ok(Decided { decision: d, .. }) if !caches_denies(rule) => (d, Source::Global),
            Ok(Decided {
                decision: d, next, ..
            }) => {
                match deny_to_cache(&d, next, cost) {
                    Some((deny, from)) => self.denies.put(key, quotas.counted, from, &deny),
                    None => self.denies.forget(key),
                }
                (d, Source::Global)
            }
            Err(cause) => {
                self.denies.forget(key);
                self.fail(locks, key, quotas.shown, cost, cause)
            }
        }
    }

    /// One exact decision from Redis, committed with the group's other
    /// requests when the rule coalesces: the first asks alone, those that
    /// arrive meanwhile, any key, are decided together when it returns.
    /// The fallback remembers the answer.
    pub(super) async fn call_exact(
        self: &Arc<Self>,
        rule: &Rule,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Answer {
        self.know_fleet(rule).await;
        let previous = self.previous(quota);
        let one = || async move {
            let target = Target {
                rule: &rule.name,
                algorithm: rule.algorithm,
                quota: &quota,
                locks: locks(rule),
            };
            let check = std::pin::pin!(self.redis.check_next(target, key, cost.get(), previous));
            self.guard.call(self.redis.reachability(), check).await
        };
        let shard = || self.redis.shard(&rule.name, key, rule.algorithm, &quota);
        let decided = match &self.queues {
            None => one().await,
            Some(queues) => match queues.join((quota, shard()), key, cost.get()) {
                // Closed: the leader went away first.
                Join::Wait(rx) => match rx.await {
                    Ok(decided) => decided,
                    Err(_) => one().await,
                },
                Join::Lead(mut leader) => {
                    let decided = one().await;
                    if let Some(batch) = leader.next(MAX_BATCH) {
                        let (this, failed) = (self.clone(), decided.is_err());
                        let drain = this.drain(rule, quota, leader, batch, failed);
                        match tokio::runtime::Handle::try_current() {
                            Ok(rt) => drop(rt.spawn(drain)),
                            // No runtime to spawn on (rare): boxed, not in
                            // every call's future.
                            Err(_) => Box::pin(drain).await,
                        }
                    }
                    decided
                }
            },
        };
        if let Ok(d) = &decided {
            self.learn(rule, key, &quota, &d.decision);
        }
        decided
    }

    /// Decides the requests queued behind a call, a batch per script call,
    /// until none are left; off the leader's request. After a failed call
    /// the queue fails too, once, rather than wait out another timeout.
    fn drain(
        self: Arc<Self>,
        rule: &Rule,
        quota: Quota,
        mut leader: Leader<Group, Answer>,
        mut batch: Batch<Answer>,
        mut failed: bool,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (name, algorithm, locks) = (rule.name.clone(), rule.algorithm, locks(rule));
        async move {
            loop {
                let skip = matches!(self.guard.admit(), Admit::Skip(_));
                if failed || skip {
                    for (_, _, tx) in batch {
                        let cause = if failed {
                            Cause::Waited
                        } else {
                            Cause::CircuitOpen
                        };
                        let _ = tx.send(Err(cause));
                    }
                } else {
                    let requests: Vec<(&Key, u32)> =
                        batch.iter().map(|(key, cost, _)| (key, *cost)).collect();
                    let previous = self.previous(quota);
                    let target = Target {
                        rule: &name,
                        algorithm,
                        quota: &quota,
                        locks,
                    };
                    let decided = {
                        let call =
                            std::pin::pin!(self.redis.check_batch(target, &requests, previous));
                        self.guard.call(self.redis.reachability(), call).await
                    };
                    match decided {
                        Ok(decided) => {
                            for ((_, _, tx), d) in batch.into_iter().zip(decided) {
                                let _ = tx.send(Ok(d));
                            }
                        }
                        Err(cause) => {
                            self.guard.failed(&cause);
                            failed = true;
                            for (_, _, tx) in batch {
                                let _ = tx.send(Err(Cause::Waited));
                            }
                        }
                    }
                }
                match leader.next(MAX_BATCH) {
                    Some(next) => batch = next,
                    None => break,
                }
            }
        }
    }
}

/// What `rule`'s scripts do with a key's lock: read it when the rule can
/// be locked, count denies toward its lockout unless it is a shadow.
pub(super) fn locks(rule: &Rule) -> Locking {
    Locking {
        read: rule.is_blockable(),
        lockout: rule.counted_lockout(),
    }
}

/// Whether cached denies may answer for `rule`: not under a lockout, whose
/// denies all count in Redis (at most its `after` calls per period and
/// key, then the lock answers here).
fn caches_denies(rule: &Rule) -> bool {
    rule.counted_lockout().is_none()
}

/// The deny Redis's answer `d` to a request of `cost` leaves for the next
/// requests, and the least cost it answers for; `None` when the key's
/// requests must ask Redis again. `next`: for an allow that left nothing,
/// the wait until one more unit fits.
fn deny_to_cache(
    d: &Decision,
    next: Option<Duration>,
    cost: NonZeroU32,
) -> Option<(Decision, NonZeroU32)> {
    match next {
        // The next request, of any cost, would be denied until `next`.
        Some(wait) if d.is_allowed() => {
            let deny = Decision::denied(d.limit(), d.window(), wait, d.reset());
            Some((deny, NonZeroU32::MIN))
        }
        _ if d.is_allowed() => None,
        // A cheaper request may fit sooner.
        _ => Some((*d, cost)),
    }
}

impl Drop for Global {
    /// Gives back what every lease has left, when a runtime can send it.
    fn drop(&mut self) {
        let Some(leases) = &self.leases else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let back = leases.drain();
        if back.is_empty() {
            return;
        }
        let (redis, (name, algorithm, patience)) = (self.redis.clone(), self.rule.clone());
        rt.spawn(async move {
            for unspent in back {
                let call = return_unspent(&redis, &name, algorithm, &unspent);
                if tokio::time::timeout(patience, call).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// Gives `unspent` back to Redis: what of it the bucket has not refilled,
/// counted as it is sent.
pub(super) async fn return_unspent(
    redis: &RedisBackend,
    name: &str,
    algorithm: crate::algorithm::Algorithm,
    unspent: &Unspent,
) -> Result<(), crate::backend::redis::RedisBackendError> {
    let units = unspent.units();
    if units == 0 {
        return Ok(());
    }
    let op = ControlOp::GiveBack(units, unspent.window);
    let target = Target::unlocked(name, algorithm, &unspent.counted);
    redis
        .control(target, &unspent.key, op, (true, None))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests;
