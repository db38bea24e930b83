//! A rule as the engine runs it: the user's [`Rule`] with its store, its
//! locks and waiters, and the control handle's operations on its state.

use std::sync::Arc;
use std::time::Duration;

use super::control::ControlError;
#[cfg(feature = "redis")]
use super::global::Global;
use super::wait::Waiters;
use crate::headers::StaticQuotaMember;
use crate::key::lookup::KeyWatch;
use crate::policy::ControlOp;
use crate::policy::QuotaChange;
use crate::rule::{QuotaSource, Rule, Scope};
use crate::store::keyspace::Budget;
use crate::store::local::LocalStore;
use crate::store::lock::Locks;
use crate::util::throttle::Throttle;
use crate::{decision::Decision, key::Key, observe, quota::Quota};

pub(crate) struct CompiledRule {
    pub(super) rule: Rule,
    /// 1 for a rule on its own; for an any-of group, its size at its
    /// first member and 0 at the others, which the first one asks.
    pub(super) span: usize,
    /// Requests without a key, watched so a limit that applies to nothing
    /// is seen.
    pub(super) watch: Arc<KeyWatch>,
    /// At most one deny event a second.
    pub(super) deny_log: observe::Sampled,
    /// At most one request-time misuse line a second (a quota from
    /// `quota_fn` that admits nothing, a cost above the capacity, a
    /// settling closure that panicked).
    pub(super) misuse_log: observe::Sampled,
    /// At most one key-space warning a minute.
    pub(super) key_space_warned: Throttle,
    /// Requests waiting per key, for `OnDeny::Wait`.
    pub(super) waiters: Arc<Waiters>,
    /// Shared with the chain a reload replaces, when the rule's state
    /// carries over (see [`Chain::compile`]).
    pub(super) store: Store,
    /// Locked keys: the rule's lockouts and the control handle's blocks
    /// (for a global rule, those this gateway learned of from Redis).
    pub(super) locks: Arc<Locks>,
    pub(super) instances: u32,
    pub(super) max_key_len: usize,
    pub(super) quota_member: Option<StaticQuotaMember>,
    /// Whether its allowed decisions record what they spent: a later rule
    /// may refuse (and refunds are on), or the response settles it.
    pub(super) records: bool,
    /// An allowed decision with fewer units remaining is near the limit:
    /// the static quota's threshold, computed once; 0 when off; `u32::MAX`
    /// for a `quota_fn` rule, whose threshold comes with each decision.
    pub(super) near_below: u32,
    /// At most one near-limit event a second.
    pub(super) near_log: observe::Sampled,
    /// Its allowed decisions' counter, resolved at build.
    pub(super) counted: observe::Counted,
}

/// The smallest count of units that is not below `ratio` of `limit`: a
/// request leaving fewer is near the limit. The float product is nudged
/// down first, so 0.2 × 10 is 2, not 3.
pub(super) fn near_threshold(ratio: f64, limit: u32) -> u32 {
    ((ratio * f64::from(limit) - 1e-9).ceil().max(0.0) as u32).min(limit)
}

#[derive(Clone)]
pub(super) enum Store {
    Local(Arc<LocalStore>),
    #[cfg(feature = "redis")]
    Global(Arc<Global>),
}

pub(super) fn new_store(rule: &Rule, instances: u32) -> Store {
    match &rule.scope {
        Scope::Local => Store::Local(Arc::new(LocalStore::new(
            rule.static_quota().map(|q| share(rule, q, instances)),
            Budget::new(rule.key_space.max_keys, rule.key_space.on_key_space_full),
        ))),
        #[cfg(feature = "redis")]
        Scope::Global(redis) => {
            Store::Global(Arc::new(Global::new(rule, redis.clone(), instances)))
        }
    }
}

impl Store {
    pub(super) fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Local(a), Self::Local(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "redis")]
            (Self::Global(a), Self::Global(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "redis")]
            _ => false,
        }
    }
}

/// The quota this instance enforces for `rule`.
pub(super) fn share(rule: &Rule, q: Quota, instances: u32) -> Quota {
    if rule.quota_use.split_across_instances {
        q.divided_by(instances)
    } else {
        q
    }
}

impl CompiledRule {
    /// Keys held in this process: its store's (a global rule's fallback
    /// shares, cached denies and leases) and its locks.
    pub(super) fn keys(&self) -> usize {
        self.locks.len()
            + match &self.store {
                Store::Local(l) => l.len(),
                #[cfg(feature = "redis")]
                Store::Global(g) => g.len(),
            }
    }

    /// The rule's store when it is local.
    pub(super) fn local_store(&self) -> Option<&LocalStore> {
        match &self.store {
            Store::Local(store) => Some(store),
            #[cfg(feature = "redis")]
            Store::Global(_) => None,
        }
    }

    /// Runs `op` on `key`; a read or an adjustment returns what a request
    /// of one unit would be told now, without spending it.
    pub(crate) async fn control(
        &self,
        key: &Key,
        op: ControlOp,
    ) -> Result<Option<Decision>, ControlError> {
        if matches!(op, ControlOp::Block(_)) && !self.rule.is_blockable() {
            return Err(ControlError::NotBlockable(self.rule.name.to_string()));
        }
        let key = self.bounded(key);
        let quota = match (&op, self.rule.static_quota()) {
            (_, Some(q)) => Some(share(&self.rule, q, self.instances)),
            (ControlOp::Block(_) | ControlOp::Unblock, None) => None,
            (_, None) => return Err(ControlError::DynamicQuota(self.rule.name.to_string())),
        };
        let within = self.rule.lock_policy.within();
        // A local rule's locks live here; a global rule's in Redis, and
        // here only as this gateway's copy, changed once Redis has.
        if matches!(self.store, Store::Local(_)) && !self.lock(&key, op, false, within) {
            return Err(ControlError::KeySpaceFull(self.rule.name.to_string()));
        }
        match &self.store {
            Store::Local(store) => Ok(match (op, quota) {
                (ControlOp::Adjust(units), Some(q)) => {
                    let d = store.adjust(&key, q, units);
                    Some(match self.locks.locked(&key) {
                        Some(left) => Decision::denied(q.limit(), q.window(), left, left),
                        None => d,
                    })
                }
                (ControlOp::Reset, _) => {
                    store.reset(&key);
                    None
                }
                _ => None,
            }),
            #[cfg(feature = "redis")]
            Store::Global(g) => {
                let out = g.control(&self.rule, &key, quota, op).await?;
                self.lock(&key, op, true, within);
                Ok(out)
            }
        }
    }

    /// A block or unblock in the local locks (`learned`: from Redis, which
    /// holds the lock too); false when a block finds no place for the key.
    fn lock(&self, key: &Key, op: ControlOp, learned: bool, within: Duration) -> bool {
        match op {
            ControlOp::Block(period) => self.locks.block(key, period, learned, within),
            ControlOp::Unblock | ControlOp::Reset => {
                self.locks.unblock(key);
                true
            }
            ControlOp::Adjust(_) | ControlOp::GiveBack(..) | ControlOp::Refund(..) => true,
        }
    }

    /// Whether `new` (of the same name) counts exactly as this rule does,
    /// so its counters stay valid. Closures can't be compared: a
    /// `quota_fn` rule keeps its state while the key and algorithm stay,
    /// and the store keeps one limiter per quota it computes.
    pub(super) fn keeps_state_for(&self, new: &Rule, instances: u32) -> bool {
        let quota = |r: &Rule, n| r.static_quota().map(|q| share(r, q, n));
        self.counts_as(new)
            && quota(&self.rule, self.instances) == quota(new, instances)
            && matches!(self.rule.quota, QuotaSource::Dynamic(_))
                == matches!(new.quota, QuotaSource::Dynamic(_))
    }

    /// Whether `new` counts as this rule does but for its quota.
    fn counts_as(&self, new: &Rule) -> bool {
        let old = &self.rule;
        let same_scope = match (&old.scope, &new.scope) {
            (Scope::Local, Scope::Local) => true,
            #[cfg(feature = "redis")]
            (Scope::Global(a), Scope::Global(b)) => {
                a.same(b) && old.failure == new.failure && old.global == new.global
            }
            #[cfg(feature = "redis")]
            _ => false,
        };
        same_scope
            && old.key.name() == new.key.name()
            && (old.key_space.max_keys, old.key_space.on_key_space_full)
                == (new.key_space.max_keys, new.key_space.on_key_space_full)
            && old.algorithm == new.algorithm
    }

    /// A rule whose static quota `new` changes: makes `backend` carry each
    /// key's usage over as `new` says. Whether it will, and for a local
    /// rule, what the reload settles after the swap.
    pub(super) fn convert_into(
        &self,
        new: &Rule,
        store: &Store,
        instances: u32,
    ) -> Option<Option<Carry>> {
        let (Some(a), Some(b)) = (self.rule.static_quota(), new.static_quota()) else {
            return None;
        };
        if !self.counts_as(new) {
            return None;
        }
        let how = new.quota_use.on_quota_change;
        match (&self.store, store) {
            (Store::Local(_), Store::Local(_)) if how == QuotaChange::Reset => None,
            (Store::Local(from), Store::Local(to)) => {
                let (a, b) = (
                    share(&self.rule, a, self.instances),
                    share(new, b, instances),
                );
                to.inherit_from(from, a, b, how);
                Some(Some(Carry {
                    to: to.clone(),
                    from: from.clone(),
                    quotas: (a, b),
                    how,
                }))
            }
            // Redis converts each key at its next decision.
            #[cfg(feature = "redis")]
            (Store::Global(was), Store::Global(to)) => {
                to.converting_from(new, a, was);
                Some(None)
            }
            #[cfg(feature = "redis")]
            _ => None,
        }
    }
}

/// A local store that inherits from the one it replaces until the reload,
/// after the swap, has carried every key over.
pub(crate) struct Carry {
    to: Arc<LocalStore>,
    from: Arc<LocalStore>,
    /// The old quota and the new.
    quotas: (Quota, Quota),
    how: QuotaChange,
}

impl Carry {
    /// Called just before the swap: requests still suspended on the old
    /// rules after it decide in the new store.
    pub(crate) fn forward(&self) {
        let (a, b) = self.quotas;
        self.to.succeed(&self.from, a, b, self.how);
    }

    /// Called once the new rules decide: the old ones decide no more, so
    /// every request they decided is counted.
    pub(crate) fn settle(self) {
        self.to.adopt_all(&self.from, self.quotas.1);
    }
}
