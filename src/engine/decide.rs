//! The steps of one request through one rule: key, quota, cost, locks,
//! the backend's decision, waiting it out (`OnDeny::Wait`), and what the
//! chain is told.

use std::num::NonZeroU32;
use std::sync::Arc;

use http::StatusCode;
use http::request::Parts;

#[cfg(feature = "redis")]
use super::global::{Asked, Global};
use super::rule::{CompiledRule, Store, share};
use super::spend::{Settlement, Spend, Spends};
use crate::decision::Decisions;
use crate::headers::StaticQuotaMember;
use crate::key::Misconfig;
use crate::key::lookup::{Found, Lookup, lookup};
use crate::policy::OnDeny;
use crate::rule::{Cost, QuotaSource};
use crate::store::local::LocalStore;
use crate::util::instant::after;
use crate::util::now_or_later::NowOrLater;
use crate::{
    decision::Decision, decision::RuleDecision, decision::Source, key::Key, observe, quota::Quota,
};

/// One rule's contribution.
pub(crate) enum Outcome {
    /// The rule does not apply (no key, zero cost).
    Skip,
    /// A missing key the rule named rejects with this status; a 500 when
    /// its source is missing from the setup.
    Reject(Arc<str>, StatusCode, Option<Misconfig>),
    /// With what it spent, when the rule records it (boxed: most rules
    /// don't, and the outcome moves through every step).
    Decided(RuleDecision, Option<Box<Spend>>),
    /// An any-of group's members (see `any_of`).
    Group(Box<Grouped>),
}

/// What an any-of group decided: its members' decisions, in the order the
/// headers show them (the group's order, on a refusal too), and
/// what the member that admitted spent.
pub(crate) struct Grouped {
    pub(super) decisions: Vec<RuleDecision>,
    pub(super) spend: Option<Box<Spend>>,
    pub(super) allowed: bool,
}

pub(crate) type Step = NowOrLater<Outcome>;

/// The chain's verdict on a request. The decisions it rests on are in the
/// caller's [`Decisions`], filled in place: they are too big to move
/// through every step.
pub(crate) enum Verdict {
    /// Go on; these settle on the response.
    Allow(Option<Box<Settlement>>),
    /// The last `n` decisions answer: the refusing rule's, or an any-of
    /// group's members' in the group's order (the soonest gives the `Retry-After`).
    Deny(usize),
    /// `rule` rejects the request with `status`.
    Reject {
        rule: Arc<str>,
        status: StatusCode,
        misconfig: Option<Misconfig>,
    },
}

/// An allow, with the spends the response settles.
#[inline]
pub(super) fn allow(spends: Spends) -> Verdict {
    let settle = if spends.0.is_empty() {
        None
    } else {
        spends.into_settlement()
    };
    Verdict::Allow(settle)
}

/// Adds one outcome; returns the verdict when it ends evaluation, after
/// giving back what the rules before spent. Inlined: the outcome's
/// decision then moves once, into `decisions`.
#[inline(always)]
pub(super) fn fold(
    decisions: &mut Decisions,
    spends: &mut Spends,
    outcome: Outcome,
) -> Option<Verdict> {
    match outcome {
        Outcome::Skip => None,
        Outcome::Reject(rule, status, misconfig) => {
            spends.refund();
            Some(Verdict::Reject {
                rule,
                status,
                misconfig,
            })
        }
        Outcome::Decided(d, spend) => {
            let deny = !d.decision.is_allowed() && !d.shadow;
            decisions.push(d);
            if deny {
                spends.refund();
                return Some(Verdict::Deny(1));
            }
            if let Some(s) = spend {
                spends.0.push(*s);
            }
            None
        }
        Outcome::Group(g) => fold_group(decisions, spends, *g),
    }
}

#[inline(never)]
fn fold_group(decisions: &mut Decisions, spends: &mut Spends, g: Grouped) -> Option<Verdict> {
    let n = g.decisions.len();
    decisions.extend(g.decisions);
    if !g.allowed {
        spends.refund();
        return Some(Verdict::Deny(n));
    }
    if let Some(s) = g.spend {
        spends.0.push(*s);
    }
    None
}

impl CompiledRule {
    pub(super) fn step(self: &Arc<Self>, parts: &Parts) -> Step {
        if let Some(exempt) = &self.rule.exempt
            && exempt.matches(&self.rule.key, parts)
        {
            observe::exempt(&self.rule.name);
            return Step::Now(Outcome::Skip);
        }
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
        match lookup(
            self.rule.on_missing.as_ref(),
            &self.rule.key,
            parts,
            &self.watch,
        ) {
            Lookup::Now(found) => self.on_found(found, quota, cost),
            Lookup::Later(f) => {
                let this = self.clone();
                Step::Later(Box::pin(async move {
                    this.on_found(f.await, quota, cost).resolve().await
                }))
            }
        }
    }

    pub(super) fn on_found(self: &Arc<Self>, found: Found, quota: Quota, cost: NonZeroU32) -> Step {
        match found {
            Found::Key(key) => self.decide(key, quota, cost),
            Found::Reject(status, misconfig) => {
                Step::Now(Outcome::Reject(self.rule.name.clone(), status, misconfig))
            }
            Found::Skip => Step::Now(Outcome::Skip),
        }
    }

    pub(super) fn decide(self: &Arc<Self>, key: Key, quota: Quota, cost: NonZeroU32) -> Step {
        if let Some(step) = self.refused_first(&key, quota, cost) {
            return step;
        }
        // Without `redis` the match has one arm.
        #[cfg_attr(not(feature = "redis"), allow(clippy::infallible_destructuring_match))]
        let store = match &self.store {
            Store::Local(store) => store,
            #[cfg(feature = "redis")]
            Store::Global(_) => return self.decide_global(key, quota, cost),
        };
        // The hot path: a local decision, returned as is. A diverted key
        // (the key space is full) is neither locked out nor refunded: it
        // was counted in the shared bucket, or refused for want of a place.
        let (d, diverted) = self.check_local(store, &key, quota, cost);
        if !d.is_allowed()
            && !diverted
            && self.rule.lock_policy.lockout.is_some()
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

    /// What every rule refuses before its store: a locked key, a
    /// request-time quota that admits nothing, a cost above the capacity.
    #[inline(always)]
    pub(super) fn refused_first(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Option<Step> {
        if self.locks.any()
            && let Some(step) = self.when_locked(key, quota)
        {
            return Some(step);
        }
        // Static quotas and fixed costs were checked at build time.
        let dynamic = matches!(self.rule.quota, QuotaSource::Dynamic(_));
        if let Some(error) = dynamic.then(|| quota.validate().err()).flatten() {
            if let Some(suppressed) = self.misuse_log.take(observe::DENY_EVERY) {
                tracing::warn!(target: observe::TARGET, rule = %self.rule.name, %quota, %error, suppressed, "request-time quota admits nothing; denying");
            }
            let d = Decision::never(quota.limit(), quota.window());
            return Some(Step::Now(self.outcome(key, d, self.local_source())));
        }
        // Before any store: governor's n-cell arithmetic overflows on a huge
        // cost (a panic in debug, an admit in release).
        let capacity = self.rule.algorithm.capacity(&quota);
        if cost.get() > capacity {
            if let Some(suppressed) = self.misuse_log.take(observe::DENY_EVERY) {
                tracing::warn!(target: observe::TARGET, rule = %self.rule.name, cost = cost.get(), capacity, suppressed, "request cost above the rule's capacity; denying");
            }
            let d = Decision::never(quota.limit(), quota.window());
            return Some(Step::Now(self.outcome(key, d, self.local_source())));
        }
        None
    }

    #[cfg(feature = "redis")]
    pub(super) fn decide_global(
        self: &Arc<Self>,
        key: Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Step {
        let checked = self.check(&key, quota, cost);
        self.then_settle(key, quota, cost, checked)
    }

    /// A global decision's step: waited out when the rule waits, spent
    /// otherwise.
    #[cfg(feature = "redis")]
    pub(super) fn then_settle(
        self: &Arc<Self>,
        key: Key,
        quota: Quota,
        cost: NonZeroU32,
        checked: NowOrLater<(Decision, Source)>,
    ) -> Step {
        match checked {
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
    pub(super) fn check(
        self: &Arc<Self>,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> NowOrLater<(Decision, Source)> {
        match &self.store {
            Store::Local(store) => {
                NowOrLater::Now((self.check_local(store, key, quota, cost).0, Source::Local))
            }
            #[cfg(feature = "redis")]
            Store::Global(g) => {
                let bounded = key.clone().bounded(self.max_key_len);
                let now = g.decide_now(&self.rule, &self.locks, &bounded, quota, cost);
                self.asked(g, bounded, cost, now)
            }
        }
    }

    /// A global rule's decision made without Redis, or the future asking
    /// Redis what [`Global::decide_now`] left to it.
    #[cfg(feature = "redis")]
    pub(super) fn asked(
        self: &Arc<Self>,
        g: &Arc<Global>,
        bounded: Key,
        cost: NonZeroU32,
        now: Result<(Decision, Source), Asked>,
    ) -> NowOrLater<(Decision, Source)> {
        match now {
            Ok(decided) => NowOrLater::Now(decided),
            Err(pending) => {
                let (this, g) = (self.clone(), g.clone());
                NowOrLater::Later(Box::pin(async move {
                    g.ask(&this.rule, &this.locks, &bounded, cost, pending)
                        .await
                }))
            }
        }
    }

    pub(super) fn check_local(
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
                self.rule.key_space.max_keys,
                &self.key_space_warned,
            );
        }
        (d, diverted.is_some())
    }

    /// The key as this rule stores it: overlong keys count as their hash
    /// (allocating, so only they pay for it).
    pub(super) fn bounded<'k>(&self, key: &'k Key) -> std::borrow::Cow<'k, Key> {
        if key.len() <= self.max_key_len {
            std::borrow::Cow::Borrowed(key)
        } else {
            std::borrow::Cow::Owned(key.clone().bounded(self.max_key_len))
        }
    }

    /// The deny of a locked key; off the hot path.
    #[inline(never)]
    pub(super) fn when_locked(&self, key: &Key, quota: Quota) -> Option<Step> {
        let left = self.locks.locked(&self.bounded(key))?;
        let d = Decision::denied(quota.limit(), quota.window(), left, left);
        Some(Step::Now(self.outcome(key, d, Source::Locked)))
    }

    /// Counts a local deny toward the rule's lockout; the deny that locks
    /// the key answers with the block.
    #[inline(never)]
    pub(super) fn lock_on_deny(&self, key: &Key, quota: Quota) -> Option<Step> {
        let lockout = self.rule.counted_lockout()?;
        let block = self.locks.denied(&self.bounded(key), lockout)?;
        observe::locked(&self.rule.name, &key.fingerprint(), block);
        let d = Decision::denied(quota.limit(), quota.window(), block, block);
        Some(Step::Now(self.outcome(key, d, Source::Locked)))
    }

    /// Whether `d` is a deny this rule would rather wait out.
    pub(super) fn waits(&self, d: &Decision) -> bool {
        matches!(self.rule.on_deny, OnDeny::Wait { .. }) && !d.is_allowed() && !self.rule.shadow
    }

    /// `OnDeny::Wait`: sleeps until the unit is back and asks again, while
    /// the waits fit in `max` and the key's queue has room.
    pub(super) async fn settle(
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
        let deadline = after(tokio::time::Instant::now(), max);
        let mut place = None;
        while self.waits(&d) {
            let Some(wait) = d.retry_after() else { break };
            if wait > deadline.saturating_duration_since(tokio::time::Instant::now()) {
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

    pub(super) fn local_source(&self) -> Source {
        match self.store {
            Store::Local(_) => Source::Local,
            #[cfg(feature = "redis")]
            Store::Global(_) => Source::Global,
        }
    }

    pub(super) fn outcome(&self, key: &Key, decision: Decision, source: Source) -> Outcome {
        let shadow = self.rule.shadow;
        if source == Source::Locked {
            observe::locked_deny(&self.rule.name);
        } else if !decision.is_allowed() {
            let retry = decision.retry_after();
            observe::deny(
                &self.counted,
                &self.rule.name,
                || key.fingerprint(),
                retry,
                shadow,
                &self.deny_log,
            );
        } else {
            self.counted.allow();
            if decision.remaining() < self.near_below {
                self.near_limit(key, &decision);
            }
        }
        Outcome::Decided(self.rule_decision(key, decision, source), None)
    }

    /// `decision` as the headers and the handler see it.
    #[inline(always)]
    pub(super) fn rule_decision(
        &self,
        key: &Key,
        decision: Decision,
        source: Source,
    ) -> RuleDecision {
        RuleDecision {
            rule: self.rule.name.clone(),
            quota_member: StaticQuotaMember::for_decision(&self.quota_member, &decision),
            decision,
            source,
            shadow: self.rule.shadow,
            concurrency: false,
            hidden: self.rule.hidden,
            partition: self.rule.key_space.partition_key.then(|| key.partition()),
        }
    }

    /// An allowed decision below the compiled threshold, checked again
    /// against its own limit: a `quota_fn` rule has no compiled one, and a
    /// global rule's local fallback decides on a smaller share.
    #[cold]
    #[inline(never)]
    fn near_limit(&self, key: &Key, decision: &Decision) {
        let Some(ratio) = self.rule.quota_use.near_limit else {
            return;
        };
        if decision.remaining() >= super::rule::near_threshold(ratio, decision.limit()) {
            return;
        }
        observe::near_limit(
            &self.rule.name,
            || key.fingerprint(),
            decision.remaining(),
            decision.limit(),
            &self.near_log,
        );
    }

    /// [`outcome`](Self::outcome) of a decision that may have spent `cost`;
    /// what it spent goes with it when the rule records spends.
    #[inline(never)]
    pub(super) fn spent(
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
            // A windowed rule's refund goes to the window it was charged in.
            let windowed = quota.period().is_some() || !self.rule.algorithm.has_burst();
            *spend = Some(Box::new(Spend {
                rule: self.clone(),
                key: self.bounded(&key).into_owned(),
                quota,
                cost: cost.get(),
                source,
                charged: windowed.then(|| (std::time::Instant::now(), decision.reset())),
            }));
        }
        out
    }
}
