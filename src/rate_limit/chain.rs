//! The compiled rule chain: evaluates rules in order, sync where it can.

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::StatusCode;
use http::request::Parts;

#[cfg(feature = "redis")]
use super::global::Global;
use crate::backend::keyspace::{Budget, KeySpaceFull};
use crate::backend::local::LocalStore;
use crate::backend::lock::Locks;
use crate::decision::Decisions;
use crate::error::{BuildError, ControlError};
use crate::failure::BreakerStatus;
use crate::headers::StaticPolicy;
use crate::now_or_later::NowOrLater;
use crate::observe;
use crate::rule::{
    Cost, Found, Lookup, OnDeny, OnMissingKey, QuotaSource, Rule, Scope, valid_name,
};
use crate::throttle::Throttle;
use crate::{Decision, Key, Quota, RuleDecision, Source};

/// Settings the chain shares with every rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainConfig {
    /// `None` until `instances(n)` is called: one instance, and a warning
    /// for local fallbacks that would each admit the whole quota.
    pub(crate) instances: Option<u32>,
    pub(crate) max_key_len: usize,
    pub(crate) cleanup_every: Duration,
    /// Give back what earlier rules spent when a later one refuses.
    pub(crate) refunds: bool,
}

pub(crate) struct CompiledRule {
    rule: Rule,
    /// At most one key-space warning a minute.
    key_space_warned: Throttle,
    /// Requests waiting per key, for `OnDeny::Wait`.
    waiters: Arc<Waiters>,
    /// Shared with the chain a reload replaces, when the rule's state
    /// carries over (see [`Chain::compile`]).
    backend: Backend,
    /// Locked keys: the rule's lockouts and the control handle's blocks
    /// (for a global rule, those this gateway learned of from Redis).
    locks: Arc<Locks>,
    instances: u32,
    max_key_len: usize,
    policy: Option<StaticPolicy>,
    /// Whether its allowed decisions record what they spent: a later rule
    /// may refuse (and refunds are on), or the response settles it.
    records: bool,
}

#[derive(Clone)]
enum Backend {
    Local(Arc<LocalStore>),
    #[cfg(feature = "redis")]
    Global(Arc<Global>),
}

/// One rule's contribution.
pub(crate) enum Outcome {
    /// The rule does not apply (no key, zero cost).
    Skip,
    /// A missing key the rule rejects with this status.
    Reject(StatusCode),
    /// With what it spent, when the rule records it (boxed: most rules
    /// don't, and the outcome moves through every step).
    Decided(RuleDecision, Option<Box<Spend>>),
}

/// Units one rule spent for a request: given back when a later rule
/// refuses the request, settled on the response by a `count_if` or
/// `cost_from_response` rule.
pub(crate) struct Spend {
    rule: Arc<CompiledRule>,
    /// Bounded, as the store keeps it.
    key: Key,
    quota: Quota,
    cost: u32,
    // Where it was spent: only global rules have a choice.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    source: Source,
}

/// What the rules of one request spent so far. Dropped while the request
/// is still being decided (its client went away during an await), it gives
/// everything back: the service was never called.
#[derive(Default)]
pub(crate) struct Spends(Vec<Spend>);

impl Spends {
    /// Gives every unit back now: a later rule refused the request.
    fn refund(&mut self) {
        for s in self.0.drain(..) {
            s.rule.adjust_spent(&s, -i64::from(s.cost));
        }
    }

    /// An allowed request: the spends of the rules that settle on the
    /// response go with it; the others stay spent.
    #[inline(never)]
    fn into_settlement(mut self) -> Option<Box<Settlement>> {
        let mut kept = std::mem::take(&mut self.0);
        kept.retain(|s| s.rule.rule.settles());
        (!kept.is_empty()).then(|| Box::new(Settlement(kept)))
    }
}

impl Drop for Spends {
    #[inline]
    fn drop(&mut self) {
        // Most requests record nothing: no drain to set up.
        if !self.0.is_empty() {
            self.refund();
        }
    }
}

/// The spends of the rules that settle on the response. Dropped unsettled
/// (no response head came: the client went away, the service failed),
/// they stay spent: the handler may have done its work.
pub(crate) struct Settlement(Vec<Spend>);

impl Settlement {
    /// Keeps, gives back or charges more of each reserved cost, as the
    /// rules' closures read `res`. A panicking closure keeps the
    /// reservation; nothing is locked while it runs.
    pub(crate) fn settle(self, res: &http::response::Parts) {
        for s in self.0 {
            let rule = &s.rule.rule;
            let call = |what: &'static str, f: &dyn Fn() -> u32| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
                    tracing::error!(target: observe::TARGET, rule = %rule.name, what, "closure panicked; the request keeps its reserved cost");
                })
            };
            if let Some(f) = &rule.count_if {
                match call("count_if", &|| u32::from(f(res))) {
                    Ok(0) => {
                        s.rule.adjust_spent(&s, -i64::from(s.cost));
                        continue;
                    }
                    Ok(_) => {}
                    Err(()) => continue,
                }
            }
            if let Some(f) = &rule.cost_from_response
                && let Ok(actual) = call("cost_from_response", &|| f(res))
            {
                let delta = i64::from(actual) - i64::from(s.cost);
                if delta != 0 {
                    s.rule.adjust_spent(&s, delta);
                }
            }
        }
    }
}

pub(crate) type Step = NowOrLater<Outcome>;

/// The chain's verdict on a request.
pub(crate) enum Verdict {
    /// Go on; these rules applied, and these settle on the response.
    Allow(Decisions, Option<Box<Settlement>>),
    /// The last decision is the deny (or the rejection's rule is `rule`).
    Deny(Decisions),
    Reject {
        rule: Arc<str>,
        status: StatusCode,
        decisions: Decisions,
    },
}

/// Where evaluation stopped to await; it holds the chain it started on,
/// so a reload meanwhile does not change the rules it finishes with.
pub(crate) struct Suspended {
    chain: Arc<Chain>,
    next: usize,
    decisions: Decisions,
    spends: Spends,
    pending: BoxFuture<'static, Outcome>,
}

pub(crate) struct Chain {
    rules: Vec<Arc<CompiledRule>>,
    cleanup_every: Duration,
    sweeper: OnceLock<()>,
}

impl Chain {
    /// `policies`: the headers include `RateLimit-Policy`, so each static
    /// rule's member is rendered once here; otherwise decisions carry none.
    ///
    /// `previous`: the chain a reload replaces. A rule whose name, key,
    /// quota, algorithm and scope (and, for global rules, Redis backend
    /// and failure policy) are unchanged keeps its counters and waiters.
    pub(crate) fn compile(
        rules: Vec<Rule>,
        cfg: ChainConfig,
        policies: bool,
        previous: Option<&Chain>,
    ) -> Result<Self, BuildError> {
        if rules.is_empty() {
            return Err(BuildError::NoRules);
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(rules.len());
        let instances = cfg.instances.unwrap_or(1);
        let last = rules.len() - 1;
        for (i, rule) in rules.into_iter().enumerate() {
            validate(&rule, cfg.instances)?;
            if !seen.insert(rule.name.clone()) {
                return Err(BuildError::DuplicateRule(rule.name.to_string()));
            }
            let kept = previous
                .and_then(|p| p.rules.iter().find(|old| old.rule.name == rule.name))
                .filter(|old| old.keeps_state_for(&rule, instances));
            let (backend, waiters, locks) = match kept {
                Some(old) => (old.backend.clone(), old.waiters.clone(), old.locks.clone()),
                None => (
                    new_backend(&rule, instances),
                    Arc::default(),
                    Arc::new(Locks::new(Budget::new(rule.max_keys, KeySpaceFull::Refuse))),
                ),
            };
            let policy = rule.static_quota().filter(|_| policies).and_then(|q| {
                let q = share(&rule, q, instances);
                StaticPolicy::new(&rule.name, q.limit(), q.window(), false)
            });
            let records = rule.settles() || (cfg.refunds && i < last);
            out.push(Arc::new(CompiledRule {
                records,
                key_space_warned: Throttle::default(),
                waiters,
                backend,
                locks,
                policy,
                rule,
                instances,
                max_key_len: cfg.max_key_len,
            }));
        }
        Ok(Self {
            rules: out,
            cleanup_every: cfg.cleanup_every,
            sweeper: OnceLock::new(),
        })
    }

    /// How many rules of this chain kept the state of `previous`'s.
    pub(crate) fn kept_from(&self, previous: &Chain) -> usize {
        self.rules
            .iter()
            .filter(|r| previous.rules.iter().any(|p| p.backend.same(&r.backend)))
            .count()
    }

    /// The sweep needs a Tokio runtime, which may not exist when the layer
    /// is built, so it starts with the first request and ends with the chain.
    fn start_sweeper(self: &Arc<Self>) {
        if self.sweeper.get().is_some() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeper.set(()).is_err() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let every = self.cleanup_every;
        handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(chain) = weak.upgrade() else { break };
                chain.cleanup();
            }
        });
    }

    /// The circuit breaker of each global rule, by rule name.
    pub(crate) fn breakers(&self) -> Vec<BreakerStatus> {
        self.rules
            .iter()
            .filter_map(|r| match &r.backend {
                #[cfg(feature = "redis")]
                Backend::Global(g) => Some(g.breaker_status()),
                Backend::Local(_) => None,
            })
            .collect()
    }

    /// The compiled rule named `name`.
    pub(crate) fn find(&self, name: &str) -> Option<&Arc<CompiledRule>> {
        self.rules.iter().find(|r| &*r.rule.name == name)
    }

    pub(crate) fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    /// Keys held in this process: local rules, fallback shares and cached denies.
    pub(crate) fn local_keys(&self) -> usize {
        self.rules
            .iter()
            .map(|r| {
                r.locks.len()
                    + match &r.backend {
                        Backend::Local(l) => l.len(),
                        #[cfg(feature = "redis")]
                        Backend::Global(g) => g.len(),
                    }
            })
            .sum()
    }

    pub(crate) fn cleanup(&self) {
        for r in &self.rules {
            r.locks
                .cleanup(r.rule.lockout.map_or(Duration::ZERO, |l| l.within));
            match &r.backend {
                Backend::Local(l) => l.cleanup(),
                #[cfg(feature = "redis")]
                Backend::Global(g) => g.cleanup(&r.rule),
            }
        }
    }

    /// Evaluates without awaiting while every step is ready, else returns
    /// where it stopped (boxed: it moves into a boxed future anyway).
    pub(crate) fn evaluate(self: &Arc<Self>, parts: &Parts) -> Result<Verdict, Box<Suspended>> {
        self.start_sweeper();
        let mut decisions = Decisions::new();
        let mut spends = Spends::default();
        for (i, rule) in self.rules.iter().enumerate() {
            match rule.step(parts) {
                Step::Now(o) => {
                    if let Some(v) = fold(&rule.rule, &mut decisions, &mut spends, o) {
                        return Ok(v);
                    }
                }
                Step::Later(pending) => {
                    return Err(Box::new(Suspended {
                        chain: self.clone(),
                        next: i + 1,
                        decisions,
                        spends,
                        pending,
                    }));
                }
            }
        }
        Ok(allow(decisions, spends))
    }
}

impl Suspended {
    /// Finishes an evaluation that had to await, on the chain it began on.
    pub(crate) async fn resume(self: Box<Self>, parts: Parts) -> (Parts, Verdict) {
        let s = *self;
        let this = s.chain;
        let (mut decisions, mut spends) = (s.decisions, s.spends);
        let outcome = s.pending.await;
        let rule = &this.rules[s.next - 1].rule;
        if let Some(v) = fold(rule, &mut decisions, &mut spends, outcome) {
            return (parts, v);
        }
        for rule in &this.rules[s.next..] {
            let outcome = rule.step(&parts).resolve().await;
            if let Some(v) = fold(&rule.rule, &mut decisions, &mut spends, outcome) {
                return (parts, v);
            }
        }
        (parts, allow(decisions, spends))
    }
}

/// An allow, with the spends the response settles.
#[inline]
fn allow(decisions: Decisions, spends: Spends) -> Verdict {
    let settle = if spends.0.is_empty() {
        None
    } else {
        spends.into_settlement()
    };
    Verdict::Allow(decisions, settle)
}

/// Adds one outcome; returns the verdict when it ends evaluation, after
/// giving back what the rules before spent.
fn fold(
    rule: &Rule,
    decisions: &mut Decisions,
    spends: &mut Spends,
    outcome: Outcome,
) -> Option<Verdict> {
    match outcome {
        Outcome::Skip => None,
        Outcome::Reject(status) => {
            spends.refund();
            Some(Verdict::Reject {
                rule: rule.name.clone(),
                status,
                decisions: std::mem::take(decisions),
            })
        }
        Outcome::Decided(d, spend) => {
            let deny = !d.decision.is_allowed() && !d.shadow;
            decisions.push(d);
            if deny {
                spends.refund();
                return Some(Verdict::Deny(std::mem::take(decisions)));
            }
            if let Some(s) = spend {
                spends.0.push(*s);
            }
            None
        }
    }
}

fn validate(rule: &Rule, instances: Option<u32>) -> Result<(), BuildError> {
    let name = &rule.name;
    if !valid_name(name) {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    let rule_err = || name.to_string();
    rule.on_missing.check_keys(&rule.key, name)?;
    if let Some(lockout) = rule.lockout {
        lockout.validate()?;
        if matches!(rule.on_deny, OnDeny::Wait { .. }) {
            return Err(BuildError::InvalidSetting(
                "a lockout and OnDeny::Wait don't go together: a waiting request is slowed, not refused",
            ));
        }
    }
    if rule.settles() && matches!(rule.cost, Cost::Fixed(0)) {
        return Err(BuildError::InvalidSetting(
            "count_if and cost_from_response need a request cost of at least 1: it is the reservation",
        ));
    }
    if rule.max_keys == 0 {
        return Err(BuildError::InvalidSetting("max_keys must be at least 1"));
    }
    if let OnDeny::Wait { max, queue } = rule.on_deny
        && (max.is_zero() || queue == 0)
    {
        return Err(BuildError::InvalidSetting(
            "OnDeny::Wait needs a positive max and a queue of at least 1",
        ));
    }
    #[cfg(feature = "redis")]
    if let Scope::Global(redis) = &rule.scope {
        crate::backend::redis::validate_global(name, &rule.failure, redis, instances)?;
    }
    #[cfg(feature = "redis")]
    validate_lease(rule)?;
    // A calendar quota counts its own way, whatever the algorithm.
    let calendar = rule.static_quota().is_some_and(|q| q.period().is_some());
    if matches!(rule.scope, Scope::Local) && !rule.algorithm.runs_locally() && !calendar {
        return Err(BuildError::AlgorithmNotLocal {
            rule: rule_err(),
            algorithm: rule.algorithm,
        });
    }
    if let QuotaSource::Static(q) = rule.quota {
        q.validate().map_err(|error| BuildError::InvalidQuota {
            rule: rule_err(),
            error,
        })?;
        if !rule.algorithm.has_burst() && q.burst() != q.limit() {
            return Err(BuildError::BurstNotSupported {
                rule: rule_err(),
                algorithm: rule.algorithm,
            });
        }
        // Against what this instance enforces: a split rule's share.
        let capacity = share(rule, q, instances.unwrap_or(1)).burst();
        if let Cost::Fixed(cost) = rule.cost
            && cost > capacity
        {
            return Err(BuildError::CostAboveCapacity {
                rule: rule_err(),
                cost,
                capacity,
            });
        }
    }
    Ok(())
}

/// A lease needs a global rule without a lockout, and a static quota it
/// can keep its bound for (request-time quotas that cannot are decided
/// exactly).
#[cfg(feature = "redis")]
fn validate_lease(rule: &Rule) -> Result<(), BuildError> {
    let Some(lease) = rule.lease else {
        return Ok(());
    };
    lease.validate()?;
    if matches!(rule.scope, Scope::Local) {
        return Err(BuildError::InvalidSetting(
            "a lease needs a global rule: local rules already decide in the gateway",
        ));
    }
    if rule.lockout.is_some() {
        return Err(BuildError::InvalidSetting(
            "a lease and a lockout don't go together: every deny must reach Redis to count",
        ));
    }
    if let QuotaSource::Static(q) = rule.quota {
        let Some(counted) = lease.counted(q, rule.algorithm) else {
            return Err(BuildError::InvalidSetting(
                "this quota cannot be leased: a calendar quota, or a burst no larger than \
                 the units one lease ttl brings (shorten the ttl or raise the burst)",
            ));
        };
        if let Cost::Fixed(cost) = rule.cost
            && cost > rule.algorithm.capacity(&counted)
        {
            return Err(BuildError::InvalidSetting(
                "the request cost is above what Redis counts leases in (the burst less one ttl of units)",
            ));
        }
    }
    Ok(())
}

/// Requests waiting per key; a key is removed when its last waiter leaves.
#[derive(Default)]
struct Waiters(dashmap::DashMap<Key, u32>);

/// One waiter's place; dropping it (the request went on, or its client went
/// away) frees the place.
struct Place {
    waiters: Arc<Waiters>,
    key: Key,
}

impl Waiters {
    fn enter(self: &Arc<Self>, key: Key, queue: u32) -> Option<Place> {
        let mut n = self.0.entry(key.clone()).or_insert(0);
        if *n >= queue {
            return None;
        }
        *n += 1;
        drop(n);
        Some(Place {
            waiters: self.clone(),
            key,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.waiters.0.remove_if_mut(&self.key, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}

fn new_backend(rule: &Rule, instances: u32) -> Backend {
    match &rule.scope {
        Scope::Local => Backend::Local(Arc::new(LocalStore::new(
            rule.static_quota().map(|q| share(rule, q, instances)),
            Budget::new(rule.max_keys, rule.on_key_space_full),
        ))),
        #[cfg(feature = "redis")]
        Scope::Global(redis) => {
            Backend::Global(Arc::new(Global::new(rule, redis.clone(), instances)))
        }
    }
}

impl Backend {
    fn same(&self, other: &Self) -> bool {
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
fn share(rule: &Rule, q: Quota, instances: u32) -> Quota {
    if rule.split_across_instances {
        q.divided_by(instances)
    } else {
        q
    }
}

/// What [`Control`](crate::Control) does to one key of one rule.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ControlOp {
    /// Spend (positive) or give back (negative) units; 0 only reads.
    Adjust(i64),
    Reset,
    Block(Duration),
    Unblock,
}

impl CompiledRule {
    /// Runs `op` on `key`; a read or an adjustment returns what a request
    /// of one unit would be told now, without spending it.
    pub(crate) async fn control(
        &self,
        key: &Key,
        op: ControlOp,
    ) -> Result<Option<Decision>, ControlError> {
        let key = self.bounded(key);
        let quota = match (&op, self.rule.static_quota()) {
            (_, Some(q)) => Some(share(&self.rule, q, self.instances)),
            (ControlOp::Block(_) | ControlOp::Unblock, None) => None,
            (_, None) => return Err(ControlError::DynamicQuota(self.rule.name.to_string())),
        };
        let within = self.rule.lockout.map_or(Duration::ZERO, |l| l.within);
        // A local rule's locks live here; a global rule's in Redis, and
        // here only as this gateway's copy, changed once Redis has.
        if matches!(self.backend, Backend::Local(_)) {
            match op {
                ControlOp::Block(period) => {
                    if !self.locks.block(&key, period, false, within) {
                        return Err(ControlError::KeySpaceFull(self.rule.name.to_string()));
                    }
                }
                ControlOp::Unblock | ControlOp::Reset => self.locks.unblock(&key),
                ControlOp::Adjust(_) => {}
            }
        }
        match &self.backend {
            Backend::Local(store) => Ok(match (op, quota) {
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
            Backend::Global(g) => {
                let out = g.control(&self.rule, &key, quota, op).await?;
                match op {
                    ControlOp::Block(period) => {
                        self.locks.block(&key, period, true, within);
                    }
                    ControlOp::Unblock | ControlOp::Reset => self.locks.unblock(&key),
                    ControlOp::Adjust(_) => {}
                }
                Ok(out)
            }
        }
    }

    /// Whether `new` (of the same name) counts exactly as this rule does,
    /// so its counters stay valid. Closures can't be compared: a
    /// `quota_fn` rule keeps its state while the key and algorithm stay,
    /// and the store keeps one limiter per quota it computes.
    fn keeps_state_for(&self, new: &Rule, instances: u32) -> bool {
        let old = &self.rule;
        let quota = |r: &Rule, n| r.static_quota().map(|q| share(r, q, n));
        let same_scope = match (&old.scope, &new.scope) {
            (Scope::Local, Scope::Local) => true,
            #[cfg(feature = "redis")]
            (Scope::Global(a), Scope::Global(b)) => {
                a.same(b) && old.failure == new.failure && old.lease == new.lease
            }
            #[cfg(feature = "redis")]
            _ => false,
        };
        same_scope
            && old.key.name() == new.key.name()
            && (old.max_keys, old.on_key_space_full) == (new.max_keys, new.on_key_space_full)
            && old.algorithm == new.algorithm
            && quota(old, self.instances) == quota(new, instances)
            && matches!(old.quota, QuotaSource::Dynamic(_))
                == matches!(new.quota, QuotaSource::Dynamic(_))
    }

    fn step(self: &Arc<Self>, parts: &Parts) -> Step {
        let quota = match &self.rule.quota {
            QuotaSource::Static(q) => share(&self.rule, *q, self.instances),
            QuotaSource::Dynamic(f) => share(&self.rule, f(parts), self.instances),
        };
        let cost = match &self.rule.cost {
            Cost::Fixed(c) => *c,
            Cost::Dynamic(f) => f(parts),
        };
        let Some(cost) = NonZeroU32::new(cost) else {
            return Step::Now(Outcome::Skip);
        };
        match self.rule.on_missing.lookup(&self.rule.key, parts) {
            Lookup::Now(found) => self.on_found(found, quota, cost),
            Lookup::Later(f) => {
                let this = self.clone();
                Step::Later(Box::pin(async move {
                    this.on_found(f.await, quota, cost).resolve().await
                }))
            }
        }
    }

    fn on_found(self: &Arc<Self>, found: Found, quota: Quota, cost: NonZeroU32) -> Step {
        match found {
            Found::Key(key) => self.decide(key, quota, cost),
            Found::Missing => Step::Now(self.missing()),
            Found::Skip => Step::Now(Outcome::Skip),
        }
    }

    fn missing(&self) -> Outcome {
        match &self.rule.on_missing {
            OnMissingKey::Reject(status) => Outcome::Reject(*status),
            _ => Outcome::Skip,
        }
    }

    fn decide(self: &Arc<Self>, key: Key, quota: Quota, cost: NonZeroU32) -> Step {
        if self.locks.any()
            && let Some(step) = self.when_locked(&key, quota)
        {
            return step;
        }
        // Static quotas and fixed costs were checked at build time.
        let dynamic = matches!(self.rule.quota, QuotaSource::Dynamic(_));
        if let Some(error) = dynamic.then(|| quota.validate().err()).flatten() {
            tracing::warn!(target: observe::TARGET, rule = %self.rule.name, %quota, %error, "request-time quota admits nothing; denying");
            let d = Decision::never(quota.limit(), quota.window());
            return Step::Now(self.outcome(&key, d, self.local_source()));
        }
        // Before any backend: governor's n-cell arithmetic overflows on a huge
        // cost (a panic in debug, an admit in release).
        let capacity = self.rule.algorithm.capacity(&quota);
        if cost.get() > capacity {
            tracing::warn!(target: observe::TARGET, rule = %self.rule.name, cost = cost.get(), capacity, "request cost above the rule's capacity; denying");
            let d = Decision::never(quota.limit(), quota.window());
            return Step::Now(self.outcome(&key, d, self.local_source()));
        }
        // Without `redis` the match has one arm.
        #[cfg_attr(not(feature = "redis"), allow(clippy::infallible_destructuring_match))]
        let store = match &self.backend {
            Backend::Local(store) => store,
            #[cfg(feature = "redis")]
            Backend::Global(_) => return self.decide_global(key, quota, cost),
        };
        // The hot path: a local decision, returned as is. A diverted key
        // (the key space is full) is neither locked out nor refunded: it
        // was counted in the shared bucket, or refused for want of a place.
        let (d, diverted) = self.check_local(store, &key, quota, cost);
        if !d.is_allowed()
            && !diverted
            && self.rule.lockout.is_some()
            && let Some(step) = self.lock_on_deny(&key, quota)
        {
            return step;
        }
        if self.waits(&d) {
            Step::Later(Box::pin(self.clone().settle(
                key,
                quota,
                cost,
                d,
                Source::Local,
            )))
        } else if self.records && !diverted {
            Step::Now(self.spent(key, quota, cost, d, Source::Local))
        } else {
            Step::Now(self.outcome(&key, d, Source::Local))
        }
    }

    #[cfg(feature = "redis")]
    fn decide_global(self: &Arc<Self>, key: Key, quota: Quota, cost: NonZeroU32) -> Step {
        match self.check(&key, quota, cost) {
            NowOrLater::Now((d, source)) if !self.waits(&d) => {
                Step::Now(self.spent(key, quota, cost, d, source))
            }
            NowOrLater::Now((d, source)) => {
                Step::Later(Box::pin(self.clone().settle(key, quota, cost, d, source)))
            }
            NowOrLater::Later(f) => {
                let this = self.clone();
                Step::Later(Box::pin(async move {
                    let (d, source) = f.await;
                    this.settle(key, quota, cost, d, source).await
                }))
            }
        }
    }

    /// One decision from the backend.
    fn check(
        self: &Arc<Self>,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> NowOrLater<(Decision, Source)> {
        match &self.backend {
            Backend::Local(store) => {
                NowOrLater::Now((self.check_local(store, key, quota, cost).0, Source::Local))
            }
            #[cfg(feature = "redis")]
            Backend::Global(g) => {
                let bounded = key.clone().bounded(self.max_key_len);
                match g.decide_now(&self.rule, &self.locks, &bounded, quota, cost) {
                    Ok(decided) => NowOrLater::Now(decided),
                    Err(pending) => {
                        let (this, g) = (self.clone(), g.clone());
                        NowOrLater::Later(Box::pin(async move {
                            g.ask(&this.rule, &this.locks, &bounded, (quota, cost), pending)
                                .await
                        }))
                    }
                }
            }
        }
    }

    fn check_local(
        &self,
        store: &LocalStore,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> (Decision, bool) {
        // Cloning a fresh `Bytes` allocates: only overlong keys pay for it.
        let (d, diverted) = if key.len() <= self.max_key_len {
            store.check(key, quota, cost)
        } else {
            store.check(&key.clone().bounded(self.max_key_len), quota, cost)
        };
        if let Some(how) = diverted {
            observe::key_space_full(
                &self.rule.name,
                how,
                self.rule.max_keys,
                &self.key_space_warned,
            );
        }
        (d, diverted.is_some())
    }

    /// The key as this rule stores it: overlong keys count as their hash
    /// (allocating, so only they pay for it).
    fn bounded<'k>(&self, key: &'k Key) -> std::borrow::Cow<'k, Key> {
        if key.len() <= self.max_key_len {
            std::borrow::Cow::Borrowed(key)
        } else {
            std::borrow::Cow::Owned(key.clone().bounded(self.max_key_len))
        }
    }

    /// The deny of a locked key; off the hot path.
    #[inline(never)]
    fn when_locked(&self, key: &Key, quota: Quota) -> Option<Step> {
        let left = self.locks.locked(&self.bounded(key))?;
        let d = Decision::denied(quota.limit(), quota.window(), left, left);
        Some(Step::Now(self.outcome(key, d, Source::Locked)))
    }

    /// Counts a local deny toward the rule's lockout; the deny that locks
    /// the key answers with the block.
    #[inline(never)]
    fn lock_on_deny(&self, key: &Key, quota: Quota) -> Option<Step> {
        let lockout = self.rule.lockout.filter(|_| !self.rule.shadow)?;
        let block = self.locks.denied(&self.bounded(key), lockout)?;
        observe::locked(&self.rule.name, &key.fingerprint(), block);
        let d = Decision::denied(quota.limit(), quota.window(), block, block);
        Some(Step::Now(self.outcome(key, d, Source::Locked)))
    }

    /// Whether `d` is a deny this rule would rather wait out.
    fn waits(&self, d: &Decision) -> bool {
        matches!(self.rule.on_deny, OnDeny::Wait { .. }) && !d.is_allowed() && !self.rule.shadow
    }

    /// `OnDeny::Wait`: sleeps until the unit is back and asks again, while
    /// the waits fit in `max` and the key's queue has room.
    async fn settle(
        self: Arc<Self>,
        key: Key,
        quota: Quota,
        cost: NonZeroU32,
        mut d: Decision,
        mut source: Source,
    ) -> Outcome {
        let OnDeny::Wait { max, queue } = self.rule.on_deny else {
            return self.spent(key, quota, cost, d, source);
        };
        let deadline = tokio::time::Instant::now() + max;
        let mut place = None;
        while self.waits(&d) {
            let Some(wait) = d.retry_after() else { break };
            if tokio::time::Instant::now() + wait > deadline {
                break;
            }
            if place.is_none() {
                place = self
                    .waiters
                    .enter(key.clone().bounded(self.max_key_len), queue);
                if place.is_none() {
                    break;
                }
            }
            tokio::time::sleep(wait).await;
            // Blocked through the control handle meanwhile.
            if let Some(left) = self.locks.locked(&self.bounded(&key)) {
                let d = Decision::denied(quota.limit(), quota.window(), left, left);
                return self.outcome(&key, d, Source::Locked);
            }
            (d, source) = self.check(&key, quota, cost).resolve().await;
        }
        self.spent(key, quota, cost, d, source)
    }

    fn local_source(&self) -> Source {
        match self.backend {
            Backend::Local(_) => Source::Local,
            #[cfg(feature = "redis")]
            Backend::Global(_) => Source::Global,
        }
    }

    fn outcome(&self, key: &Key, decision: Decision, source: Source) -> Outcome {
        let shadow = self.rule.shadow;
        if source == Source::Locked {
            observe::locked_deny(&self.rule.name);
        } else if !decision.is_allowed() {
            let retry = decision.retry_after();
            observe::deny(&self.rule.name, &key.fingerprint(), retry, shadow);
        }
        Outcome::Decided(
            RuleDecision {
                rule: self.rule.name.clone(),
                policy: StaticPolicy::for_decision(&self.policy, &decision),
                decision,
                source,
                shadow,
                concurrency: false,
                hidden: !self.rule.visible,
                partition: self.rule.partition_key.then(|| key.partition()),
            },
            None,
        )
    }

    /// [`outcome`](Self::outcome) of a decision that may have spent `cost`;
    /// what it spent goes with it when the rule records spends.
    #[inline(never)]
    fn spent(
        self: &Arc<Self>,
        key: Key,
        quota: Quota,
        cost: NonZeroU32,
        decision: Decision,
        source: Source,
    ) -> Outcome {
        let mut out = self.outcome(&key, decision, source);
        let spent = matches!(
            source,
            Source::Local | Source::Global | Source::Fallback | Source::Leased
        );
        if self.records
            && decision.is_allowed()
            && spent
            && let Outcome::Decided(_, spend) = &mut out
        {
            *spend = Some(Box::new(Spend {
                rule: self.clone(),
                key: self.bounded(&key).into_owned(),
                quota,
                cost: cost.get(),
                source,
            }));
        }
        out
    }

    /// Spends (`units > 0`) or gives back what `s` spent, where it spent
    /// it. Never fails the request: a Redis failure is logged.
    fn adjust_spent(self: &Arc<Self>, s: &Spend, units: i64) {
        match &self.backend {
            Backend::Local(store) => {
                store.adjust(&s.key, s.quota, units);
            }
            #[cfg(feature = "redis")]
            Backend::Global(g) => match s.source {
                Source::Fallback => g.adjust_fallback(&s.key, s.quota, units),
                Source::Leased => g.adjust_lease(&self.rule, &s.key, s.quota, units),
                // Off the request path: the response (or the 429) is out.
                Source::Global => {
                    if let Ok(rt) = tokio::runtime::Handle::try_current() {
                        let (g, this, key, quota) =
                            (g.clone(), self.clone(), s.key.clone(), s.quota);
                        rt.spawn(
                            async move { g.adjust_redis(&this.rule, &key, quota, units).await },
                        );
                    }
                }
                _ => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::error::QuotaError;
    use crate::{Algorithm, KeyExtractor};

    fn config() -> ChainConfig {
        ChainConfig {
            instances: None,
            max_key_len: crate::key::DEFAULT_MAX_KEY_LEN,
            cleanup_every: Duration::from_secs(60),
            refunds: true,
        }
    }

    fn chain(rules: Vec<Rule>) -> Arc<Chain> {
        match Chain::compile(rules, config(), true, None) {
            Ok(c) => Arc::new(c),
            Err(e) => panic!("compile: {e}"),
        }
    }

    fn compile_err(rules: Vec<Rule>) -> BuildError {
        Chain::compile(rules, config(), true, None)
            .err()
            .expect("compile should fail")
    }

    fn parts(key: Option<&str>) -> Parts {
        let mut b = http::Request::builder().uri("/");
        if let Some(k) = key {
            b = b.header("x-key", k);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn by_key(name: &str, quota: Quota) -> Rule {
        Rule::new(name, KeyExtractor::header("x-key"), quota)
    }

    fn everyone(name: &str, quota: Quota) -> Rule {
        Rule::new(name, KeyExtractor::global(), quota)
    }

    /// The `x-key` header, found only after an await.
    fn async_by_key(name: &str, quota: Quota) -> Rule {
        let key = KeyExtractor::new_async("async", |p: &Parts| {
            let k = p
                .headers
                .get("x-key")
                .map(|v| Key::copy_from_slice(v.as_bytes()));
            async move {
                tokio::task::yield_now().await;
                k
            }
        });
        Rule::new(name, key, quota)
    }

    fn eval(chain: &Arc<Chain>, parts: &Parts) -> Verdict {
        match chain.evaluate(parts) {
            Ok(v) => v,
            Err(_) => panic!("evaluation suspended"),
        }
    }

    fn allowed(v: Verdict) -> Decisions {
        match v {
            Verdict::Allow(d, _) => d,
            other => panic!("expected Allow, got {}", summary(&other).0),
        }
    }

    fn denied(v: Verdict) -> Decisions {
        match v {
            Verdict::Deny(d) => d,
            other => panic!("expected Deny, got {}", summary(&other).0),
        }
    }

    /// The verdict's kind and, per decision, the rule, allowed and remaining:
    /// what does not depend on the clock.
    fn summary(v: &Verdict) -> (String, Vec<(String, bool, u32)>) {
        let (kind, ds) = match v {
            Verdict::Allow(d, _) => ("allow".to_owned(), d),
            Verdict::Deny(d) => ("deny".to_owned(), d),
            Verdict::Reject {
                rule,
                status,
                decisions,
            } => (format!("reject {rule} {}", status.as_u16()), decisions),
        };
        let ds = ds
            .iter()
            .map(|d| {
                (
                    d.rule.to_string(),
                    d.decision.is_allowed(),
                    d.decision.remaining(),
                )
            })
            .collect();
        (kind, ds)
    }

    fn names(ds: &Decisions) -> Vec<&str> {
        ds.iter().map(|d| &*d.rule).collect()
    }

    /// Keys held by rule `i`'s local store.
    fn keys(chain: &Chain, i: usize) -> usize {
        match &chain.rules[i].backend {
            Backend::Local(l) => l.len(),
            #[cfg(feature = "redis")]
            Backend::Global(_) => unreachable!("local rules only"),
        }
    }

    #[test]
    fn every_rule_is_evaluated_in_order_when_all_allow() {
        let c = chain(vec![
            by_key("first", Quota::per_minute(5)),
            everyone("second", Quota::per_minute(10)),
        ]);
        let ds = allowed(eval(&c, &parts(Some("a"))));
        assert_eq!(names(&ds), ["first", "second"]);
        assert_eq!(ds[0].decision.remaining(), 4);
        assert_eq!(ds[1].decision.remaining(), 9);
        assert!(ds.iter().all(|d| d.source == Source::Local && !d.shadow));
    }

    #[test]
    fn the_first_deny_ends_evaluation() {
        let c = chain(vec![
            everyone("open", Quota::per_minute(10)),
            by_key("tight", Quota::per_minute(1)),
            everyone("later", Quota::per_minute(10)),
        ]);
        let p = parts(Some("a"));
        assert_eq!(allowed(eval(&c, &p)).len(), 3);
        let ds = denied(eval(&c, &p));
        assert_eq!(names(&ds), ["open", "tight"]);
        let last = ds.last().unwrap();
        assert!(!last.decision.is_allowed());
        assert!(last.decision.retry_after().is_some());
        // "later" saw only the first request; "open" got the denied
        // request's unit back.
        let ds = allowed(eval(&c, &parts(Some("b"))));
        assert_eq!(names(&ds), ["open", "tight", "later"]);
        assert_eq!(ds[0].decision.remaining(), 8);
        assert_eq!(ds[2].decision.remaining(), 8);
    }

    #[test]
    fn a_deny_leaves_later_buckets_untouched() {
        let costs = Arc::new(AtomicUsize::new(0));
        let seen = costs.clone();
        let c = chain(vec![
            everyone("none-left", Quota::per_minute(1)),
            by_key("later", Quota::per_minute(10)).cost_fn(move |_| {
                seen.fetch_add(1, Ordering::Relaxed);
                1
            }),
        ]);
        allowed(eval(&c, &parts(Some("a"))));
        denied(eval(&c, &parts(Some("b"))));
        denied(eval(&c, &parts(Some("c"))));
        assert_eq!(keys(&c, 1), 1, "only the first key was counted");
        assert_eq!(costs.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_shadow_deny_is_recorded_and_evaluation_goes_on() {
        let c = chain(vec![
            everyone("trial", Quota::per_minute(1)).shadow(true),
            everyone("enforced", Quota::per_minute(10)),
        ]);
        let p = parts(None);
        allowed(eval(&c, &p));
        let ds = allowed(eval(&c, &p));
        assert_eq!(names(&ds), ["trial", "enforced"]);
        assert!(ds[0].shadow);
        assert!(!ds[0].decision.is_allowed());
        assert!(!ds[1].shadow);
        assert_eq!(ds[1].decision.remaining(), 8);
    }

    #[test]
    fn a_zero_cost_skips_the_rule() {
        let c = chain(vec![
            everyone("free", Quota::per_minute(1)).cost_fn(|_| 0),
            everyone("fixed-free", Quota::per_minute(1)).cost(0),
            everyone("paid", Quota::per_minute(10)),
        ]);
        for _ in 0..3 {
            assert_eq!(names(&allowed(eval(&c, &parts(None)))), ["paid"]);
        }
        assert_eq!((keys(&c, 0), keys(&c, 1)), (0, 0));
    }

    #[test]
    fn a_cost_above_the_burst_is_denied_without_retry_after() {
        let c = chain(vec![
            everyone("bytes", Quota::per_minute(10).with_burst(4)).cost_fn(|p| {
                p.headers
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            }),
        ]);
        let mut p = parts(None);
        p.headers.insert("x-cost", "5".parse().unwrap());
        let ds = denied(eval(&c, &p));
        let d = ds[0].decision;
        assert_eq!(d, Decision::never(10, Duration::from_secs(60)));
        assert_eq!(d.retry_after(), None);
        assert_eq!(keys(&c, 0), 0, "the bucket was not touched");
        // The whole burst is still there.
        p.headers.insert("x-cost", "4".parse().unwrap());
        let ds = allowed(eval(&c, &p));
        assert_eq!(ds[0].decision.remaining(), 0);
    }

    #[test]
    fn a_request_time_quota_that_admits_nothing_is_denied_without_retry_after() {
        let c = chain(vec![
            everyone("plan", Quota::per_minute(10)).quota_fn(|_| Quota::per_minute(0)),
        ]);
        let ds = denied(eval(&c, &parts(None)));
        assert_eq!(ds[0].decision, Decision::never(0, Duration::from_secs(60)));
        assert_eq!(keys(&c, 0), 0);
    }

    #[test]
    fn a_missing_key_is_rejected_with_the_rules_status() {
        let c = chain(vec![
            everyone("open", Quota::per_minute(10)),
            by_key("auth", Quota::per_minute(10))
                .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
            everyone("later", Quota::per_minute(10)),
        ]);
        match eval(&c, &parts(None)) {
            Verdict::Reject {
                rule,
                status,
                decisions,
            } => {
                assert_eq!(&*rule, "auth");
                assert_eq!(status, StatusCode::UNAUTHORIZED);
                assert_eq!(names(&decisions), ["open"]);
            }
            other => panic!("expected Reject, got {}", summary(&other).0),
        }
        assert_eq!(keys(&c, 2), 0);
        let ds = allowed(eval(&c, &parts(Some("a"))));
        assert_eq!(names(&ds), ["open", "auth", "later"]);
    }

    #[test]
    fn a_missing_key_skips_the_rule_by_default() {
        let c = chain(vec![
            by_key("per-key", Quota::per_minute(1)).on_missing_key(OnMissingKey::Skip),
            everyone("all", Quota::per_minute(10)),
        ]);
        for _ in 0..3 {
            assert_eq!(names(&allowed(eval(&c, &parts(None)))), ["all"]);
        }
        assert_eq!(keys(&c, 0), 0);
    }

    #[test]
    fn a_missing_key_counts_against_the_fallback() {
        let c = chain(vec![
            by_key("per-key", Quota::per_minute(1))
                .on_missing_key(OnMissingKey::Fallback(KeyExtractor::global())),
        ]);
        allowed(eval(&c, &parts(None)));
        denied(eval(&c, &parts(None)));
        allowed(eval(&c, &parts(Some("a"))));
    }

    #[test]
    fn policies_are_rendered_only_when_asked() {
        let rules = || vec![everyone("api", Quota::per_minute(10))];
        let ds = allowed(eval(&chain(rules()), &parts(None)));
        assert_eq!(ds[0].policy.as_ref().unwrap(), "\"api\";q=10;w=60");
        let c = Arc::new(Chain::compile(rules(), config(), false, None).ok().unwrap());
        assert_eq!(allowed(eval(&c, &parts(None)))[0].policy, None);
    }

    #[test]
    fn a_split_rule_enforces_its_share() {
        let cfg = ChainConfig {
            instances: Some(2),
            ..config()
        };
        let rule = everyone("split", Quota::per_minute(10)).split_across_instances(true);
        let c = Arc::new(Chain::compile(vec![rule], cfg, true, None).ok().unwrap());
        let ds = allowed(eval(&c, &parts(None)));
        assert_eq!((ds[0].decision.limit(), ds[0].decision.remaining()), (5, 4));
    }

    #[tokio::test]
    async fn an_async_key_suspends_and_resume_gives_the_sync_verdict() {
        let rules = |async_key: bool| {
            let middle = if async_key {
                async_by_key("per-key", Quota::per_minute(2))
            } else {
                by_key("per-key", Quota::per_minute(2))
            };
            vec![
                everyone("before", Quota::per_minute(10)),
                middle.on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
                everyone("after", Quota::per_minute(10)),
            ]
        };
        let (sync, slow) = (chain(rules(false)), chain(rules(true)));
        let requests = [Some("a"), Some("a"), Some("a"), None, Some("b")];
        let (mut kinds, mut last) = (Vec::new(), Vec::new());
        for key in requests {
            let expected = summary(&eval(&sync, &parts(key)));
            let s = match slow.evaluate(&parts(key)) {
                Ok(_) => panic!("an async key must suspend"),
                Err(s) => s,
            };
            // Stopped at the async rule, after the first rule's decision.
            assert_eq!(s.next, 2);
            assert_eq!(names(&s.decisions), ["before"]);
            let (p, v) = s.resume(parts(key)).await;
            assert_eq!(p.headers.get("x-key").is_some(), key.is_some());
            let got = summary(&v);
            assert_eq!(got, expected);
            kinds.push(got.0);
            last = got.1;
        }
        // "after" saw neither the deny nor the reject.
        assert_eq!(last[2], ("after".to_owned(), true, 7));
        assert_eq!(
            kinds,
            ["allow", "allow", "deny", "reject per-key 401", "allow"]
        );
    }

    #[tokio::test]
    async fn resume_goes_on_with_sync_rules_after_the_async_one() {
        let c = chain(vec![
            async_by_key("per-key", Quota::per_minute(5)),
            everyone("after", Quota::per_minute(1)),
        ]);
        let s = c.evaluate(&parts(Some("a"))).err().expect("suspends");
        assert_eq!((s.next, s.decisions.len()), (1, 0));
        let (_, v) = s.resume(parts(Some("a"))).await;
        assert_eq!(names(&allowed(v)), ["per-key", "after"]);
        let s = c.evaluate(&parts(Some("a"))).err().expect("suspends");
        let (_, v) = s.resume(parts(Some("a"))).await;
        let ds = denied(v);
        assert_eq!(names(&ds), ["per-key", "after"]);
        assert_eq!(ds[0].decision.remaining(), 3);
    }

    #[test]
    fn compile_needs_a_rule() {
        assert_eq!(compile_err(vec![]), BuildError::NoRules);
    }

    #[test]
    fn compile_rejects_duplicate_names() {
        let err = compile_err(vec![
            everyone("api", Quota::per_minute(1)),
            everyone("other", Quota::per_minute(1)),
            by_key("api", Quota::per_minute(2)),
        ]);
        assert_eq!(err, BuildError::DuplicateRule("api".into()));
    }

    #[test]
    fn compile_rejects_invalid_names() {
        for name in ["", "tab\there", "naïve"] {
            let err = compile_err(vec![everyone(name, Quota::per_minute(1))]);
            assert_eq!(err, BuildError::InvalidRuleName(name.into()));
        }
    }

    #[test]
    fn compile_rejects_a_quota_that_admits_nothing() {
        let err = compile_err(vec![everyone("api", Quota::per_minute(0))]);
        assert_eq!(
            err,
            BuildError::InvalidQuota {
                rule: "api".into(),
                error: QuotaError::ZeroLimit,
            }
        );
        let err = compile_err(vec![everyone("api", Quota::per_minute(5).with_burst(0))]);
        assert!(matches!(
            err,
            BuildError::InvalidQuota {
                error: QuotaError::ZeroBurst,
                ..
            }
        ));
    }

    #[test]
    fn compile_rejects_a_fixed_cost_above_the_burst() {
        let err = compile_err(vec![
            everyone("api", Quota::per_minute(10).with_burst(3)).cost(4),
        ]);
        assert_eq!(
            err,
            BuildError::CostAboveCapacity {
                rule: "api".into(),
                cost: 4,
                capacity: 3,
            }
        );
        // The burst itself is fine.
        chain(vec![
            everyone("api", Quota::per_minute(10).with_burst(3)).cost(3),
        ]);
    }

    #[test]
    fn compile_rejects_window_algorithms_on_local_rules() {
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let err = compile_err(vec![
                everyone("api", Quota::per_minute(10)).algorithm(algorithm),
            ]);
            assert_eq!(
                err,
                BuildError::AlgorithmNotLocal {
                    rule: "api".into(),
                    algorithm,
                }
            );
        }
        chain(vec![
            everyone("api", Quota::per_minute(10)).algorithm(Algorithm::TokenBucket),
        ]);
    }

    #[test]
    fn compile_checks_a_fixed_cost_against_a_split_share() {
        let rule = Rule::new("split", KeyExtractor::global(), Quota::per_second(10))
            .cost(5)
            .split_across_instances(true);
        let cfg = ChainConfig {
            instances: Some(3),
            ..config()
        };
        let err = Chain::compile(vec![rule], cfg, true, None)
            .err()
            .expect("5 > 10 / 3");
        assert!(
            matches!(
                err,
                BuildError::CostAboveCapacity {
                    cost: 5,
                    capacity: 4,
                    ..
                }
            ),
            "{err}"
        );
    }
}
