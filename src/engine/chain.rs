//! A layer's rules compiled into a chain, in order: built (and rebuilt on
//! reload, keeping the state of unchanged rules), swept, and evaluated.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::request::Parts;

use super::any_of::{AnyOf, Asked, spans};
use super::decide::{Outcome, Step, Verdict, allow, fold};
use super::rule::{Carry, CompiledRule, Store, near_threshold, new_store, share};
use super::spend::Spends;
use super::validate::validate;
use crate::decision::Decisions;
use crate::error::BuildError;
use crate::failure::BreakerStatus;
use crate::headers::{StaticQuotaMember, Unit};
use crate::key::lookup::KeyWatch;
use crate::policy::KeySpaceFull;
use crate::rule::Rule;
use crate::store::keyspace::Budget;
use crate::store::lock::Locks;
use crate::util::throttle::Throttle;

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

/// Where evaluation stopped to await; it holds the chain it started on,
/// so a reload meanwhile does not change the rules it finishes with.
pub(crate) struct Suspended {
    pub(super) chain: Arc<Chain>,
    pub(super) next: usize,
    pub(super) decisions: Decisions,
    pub(super) spends: Spends,
    pub(super) pending: BoxFuture<'static, Outcome>,
    /// The any-of group `pending` is a member of.
    pub(super) group: Option<Box<AnyOf>>,
}

pub(crate) struct Chain {
    pub(super) rules: Vec<Arc<CompiledRule>>,
    /// Rules whose counters a reload converts to a new quota.
    pub(crate) converted: usize,
    /// The local ones, which the reload settles after the swap.
    pub(crate) carries: Vec<Carry>,
    /// The layer's sweep schedule, carried from chain to chain by reloads.
    sweeps: Arc<Sweeps>,
    sweeper: OnceLock<()>,
    /// The `metrics` recorder the rules' counters were resolved against.
    recorder: crate::observe::RecorderSeen,
}

/// A layer's sweeps: every `every` from its first request, whatever the
/// reloads. Each reload builds a chain; the newest one that serves
/// requests sweeps, at the schedule's next time, so a layer reloaded more
/// often than `every` still forgets its idle keys.
pub(crate) struct Sweeps {
    every: Duration,
    /// The chain that sweeps (the last to serve a request), and when.
    state: std::sync::Mutex<(u64, Option<tokio::time::Instant>)>,
}

impl Sweeps {
    fn state(&self) -> std::sync::MutexGuard<'_, (u64, Option<tokio::time::Instant>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the chain that starts sweeping now the one that sweeps.
    fn enter(&self) -> u64 {
        let mut s = self.state();
        s.0 += 1;
        s.0
    }

    /// When chain `generation` sweeps next; `None` once a newer one sweeps.
    fn next(&self, generation: u64) -> Option<tokio::time::Instant> {
        let mut s = self.state();
        if s.0 != generation {
            return None;
        }
        Some(*s.1.get_or_insert_with(|| later(tokio::time::Instant::now(), self.every)))
    }

    /// The sweep due at `at` is done: the next is one period later.
    fn done(&self, at: tokio::time::Instant) {
        let mut s = self.state();
        if s.1 == Some(at) {
            s.1 = Some(later(at, self.every));
        }
    }
}

/// `every` after `at`; an interval past the clock's range (a sweep never
/// wanted) is thirty years.
fn later(at: tokio::time::Instant, every: Duration) -> tokio::time::Instant {
    const NEVER: Duration = Duration::from_secs(30 * 365 * 86_400);
    at.checked_add(every.min(NEVER)).unwrap_or(at)
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
        let spans = spans(&rules)?;
        // Where each rule's group ends: a rule after it may refuse.
        let mut group_end = 0;
        let mut converted = 0;
        let mut carries = Vec::new();
        for (i, rule) in rules.into_iter().enumerate() {
            let span = spans[i];
            if span > 0 {
                group_end = i + span - 1;
            }
            validate(&rule, cfg.instances)?;
            if !seen.insert(rule.name.clone()) {
                return Err(BuildError::DuplicateRule(rule.name.to_string()));
            }
            let old = previous.and_then(|p| p.rules.iter().find(|old| old.rule.name == rule.name));
            let (store, waiters, locks) = match old {
                Some(old) if old.keeps_state_for(&rule, instances) => {
                    (old.store.clone(), old.waiters.clone(), old.locks.clone())
                }
                _ => {
                    let store = new_store(&rule, instances);
                    let conversion = old.and_then(|old| {
                        let carry = old.convert_into(&rule, &store, instances)?;
                        Some((carry, old.locks.clone()))
                    });
                    let locks = match conversion {
                        // A changed quota: usage converted, locks kept.
                        Some((carry, locks)) => {
                            converted += 1;
                            carries.extend(carry);
                            locks
                        }
                        None => Arc::new(Locks::new(Budget::new(
                            rule.key_space.max_keys,
                            KeySpaceFull::Refuse,
                        ))),
                    };
                    (store, Arc::default(), locks)
                }
            };
            let policy = rule.static_quota().filter(|_| policies).and_then(|q| {
                let q = share(&rule, q, instances);
                StaticQuotaMember::new(&rule.name, q.limit(), q.window(), Unit::Requests)
            });
            let records = rule.settles() || (cfg.refunds && group_end < last);
            let near_below = match (rule.quota_use.near_limit, rule.static_quota()) {
                (None, _) => 0,
                (Some(r), Some(q)) => near_threshold(r, share(&rule, q, instances).limit()),
                (Some(_), None) => u32::MAX,
            };
            out.push(Arc::new(CompiledRule {
                span,
                watch: KeyWatch::new(rule.name.clone(), &rule.key),
                records,
                near_below,
                near_log: Default::default(),
                counted: crate::observe::Counted::new(&rule.name),
                key_space_warned: Throttle::default(),
                deny_log: Default::default(),
                misuse_log: Default::default(),
                waiters,
                store,
                locks,
                quota_member: policy,
                rule,
                instances,
                max_key_len: cfg.max_key_len,
            }));
        }
        Ok(Self {
            rules: out,
            converted,
            carries,
            sweeps: previous.map_or_else(
                || {
                    Arc::new(Sweeps {
                        every: cfg.cleanup_every,
                        state: Default::default(),
                    })
                },
                |p| p.sweeps.clone(),
            ),
            sweeper: OnceLock::new(),
            recorder: crate::observe::RecorderSeen::now(),
        })
    }

    /// How many rules of this chain kept the state of `previous`'s.
    pub(crate) fn kept_from(&self, previous: &Chain) -> usize {
        self.rules
            .iter()
            .filter(|r| previous.rules.iter().any(|p| p.store.same(&r.store)))
            .count()
    }

    /// The sweep needs a Tokio runtime, which may not exist when the layer
    /// is built, so it starts with the chain's first request, on the
    /// layer's schedule, and ends when a newer chain takes over or this
    /// one is dropped.
    pub(super) fn start_sweeper(self: &Arc<Self>) {
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
        let sweeps = self.sweeps.clone();
        let generation = sweeps.enter();
        handle.spawn(async move {
            while let Some(at) = sweeps.next(generation) {
                tokio::time::sleep_until(at).await;
                let Some(chain) = weak.upgrade() else { break };
                if sweeps.next(generation) != Some(at) {
                    continue;
                }
                sweeps.done(at);
                chain.cleanup();
            }
        });
    }

    /// The circuit breaker of each global rule, by rule name.
    pub(crate) fn breakers(&self) -> Vec<BreakerStatus> {
        self.rules
            .iter()
            .filter_map(|r| match &r.store {
                #[cfg(feature = "redis")]
                Store::Global(g) => Some(g.breaker_status()),
                Store::Local(_) => None,
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
        self.rules.iter().map(|r| r.keys()).sum()
    }

    pub(crate) fn cleanup(&self) {
        self.recorder.warn_if_replaced(self.rules.len());
        for r in &self.rules {
            r.locks.cleanup(r.rule.lock_policy.within());
            match &r.store {
                Store::Local(l) => l.cleanup(),
                #[cfg(feature = "redis")]
                Store::Global(g) => g.cleanup(&r.rule),
            }
            crate::observe::keys_held(&r.rule.name, r.keys());
        }
    }

    /// Evaluates into `decisions` without awaiting while every step is
    /// ready, else returns where it stopped (boxed: it moves into a boxed
    /// future anyway), the decisions so far with it.
    pub(crate) fn evaluate(
        self: &Arc<Self>,
        parts: &Parts,
        decisions: &mut Decisions,
    ) -> Result<Verdict, Box<Suspended>> {
        self.start_sweeper();
        let mut spends = Spends::default();
        for (i, rule) in self.rules.iter().enumerate() {
            let (step, group) = if rule.span == 1 {
                (rule.step(parts), None)
            } else if rule.span == 0 {
                // A member its group's first one asked.
                continue;
            } else {
                match AnyOf::start(&self.rules, i, parts) {
                    Asked::Done(step) => (step, None),
                    Asked::Awaiting(g, pending) => (Step::Later(pending), Some(g)),
                }
            };
            match step {
                Step::Now(o) => {
                    if let Some(v) = fold(decisions, &mut spends, o) {
                        return Ok(v);
                    }
                }
                Step::Later(pending) => {
                    return Err(Box::new(Suspended {
                        chain: self.clone(),
                        next: i + rule.span,
                        decisions: std::mem::take(decisions),
                        spends,
                        pending,
                        group,
                    }));
                }
            }
        }
        Ok(allow(spends))
    }
}

impl Suspended {
    /// Finishes an evaluation that had to await, on the chain it began on.
    pub(crate) async fn resume(self: Box<Self>, parts: Parts) -> (Parts, Decisions, Verdict) {
        let s = *self;
        let this = s.chain;
        let (mut decisions, mut spends) = (s.decisions, s.spends);
        let mut outcome = s.pending.await;
        if let Some(g) = s.group {
            outcome = g.resume(outcome, &this.rules, &parts).await;
        }
        if let Some(v) = fold(&mut decisions, &mut spends, outcome) {
            return (parts, decisions, v);
        }
        let mut at = s.next;
        while let Some(rule) = this.rules.get(at) {
            let outcome = match rule.span {
                1 => rule.step(&parts).resolve().await,
                _ => match AnyOf::start(&this.rules, at, &parts) {
                    Asked::Done(step) => step.resolve().await,
                    Asked::Awaiting(g, pending) => {
                        g.resume(pending.await, &this.rules, &parts).await
                    }
                },
            };
            at += rule.span.max(1);
            if let Some(v) = fold(&mut decisions, &mut spends, outcome) {
                return (parts, decisions, v);
            }
        }
        (parts, decisions, allow(spends))
    }
}
