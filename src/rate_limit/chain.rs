//! The compiled rule chain: evaluates rules in order, sync where it can.

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::StatusCode;
use http::request::Parts;

#[cfg(feature = "redis")]
use super::global::Global;
use crate::backend::local::LocalStore;
use crate::decision::Decisions;
use crate::error::BuildError;
use crate::failure::BreakerStatus;
use crate::headers::StaticPolicy;
use crate::observe;
use crate::rule::{Cost, Found, Lookup, OnMissingKey, QuotaSource, Rule, Scope, valid_name};
use crate::{Decision, Key, Quota, RuleDecision, Source};

/// Settings the chain shares with every rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainConfig {
    /// `None` until `instances(n)` is called: one instance, and a warning
    /// for local fallbacks that would each admit the whole quota.
    pub(crate) instances: Option<u32>,
    pub(crate) max_key_len: usize,
    pub(crate) cleanup_every: Duration,
}

pub(crate) struct CompiledRule {
    rule: Rule,
    backend: Backend,
    instances: u32,
    max_key_len: usize,
    policy: Option<StaticPolicy>,
}

enum Backend {
    Local(LocalStore),
    #[cfg(feature = "redis")]
    Global(Arc<Global>),
}

/// One rule's contribution.
pub(crate) enum Outcome {
    /// The rule does not apply (no key, zero cost).
    Skip,
    /// A missing key the rule rejects with this status.
    Reject(StatusCode),
    Decided(RuleDecision),
}

pub(crate) enum Step {
    Done(Outcome),
    Pending(BoxFuture<'static, Outcome>),
}

/// The chain's verdict on a request.
pub(crate) enum Verdict {
    /// Go on; these rules applied.
    Allow(Decisions),
    /// The last decision is the deny (or the rejection's rule is `rule`).
    Deny(Decisions),
    Reject {
        rule: Arc<str>,
        status: StatusCode,
        decisions: Decisions,
    },
}

/// Where evaluation stopped to await.
pub(crate) struct Suspended {
    next: usize,
    decisions: Decisions,
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
    pub(crate) fn compile(
        rules: Vec<Rule>,
        cfg: ChainConfig,
        policies: bool,
    ) -> Result<Self, BuildError> {
        if rules.is_empty() {
            return Err(BuildError::NoRules);
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(rules.len());
        let instances = cfg.instances.unwrap_or(1);
        for rule in rules {
            validate(&rule, cfg.instances)?;
            if !seen.insert(rule.name.clone()) {
                return Err(BuildError::DuplicateRule(rule.name.to_string()));
            }
            let backend = match &rule.scope {
                Scope::Local => Backend::Local(LocalStore::new(
                    rule.static_quota().map(|q| share(&rule, q, instances)),
                )),
                #[cfg(feature = "redis")]
                Scope::Global(redis) => {
                    Backend::Global(Arc::new(Global::new(&rule, redis.clone(), instances)))
                }
            };
            let policy = rule.static_quota().filter(|_| policies).and_then(|q| {
                let q = share(&rule, q, instances);
                StaticPolicy::new(&rule.name, q.limit(), q.window(), false)
            });
            out.push(Arc::new(CompiledRule {
                backend,
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

    pub(crate) fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    /// Keys held in this process: local rules, fallback shares and cached denies.
    pub(crate) fn local_keys(&self) -> usize {
        self.rules
            .iter()
            .map(|r| match &r.backend {
                Backend::Local(l) => l.len(),
                #[cfg(feature = "redis")]
                Backend::Global(g) => g.len(),
            })
            .sum()
    }

    pub(crate) fn cleanup(&self) {
        for r in &self.rules {
            match &r.backend {
                Backend::Local(l) => l.cleanup(),
                #[cfg(feature = "redis")]
                Backend::Global(g) => g.cleanup(),
            }
        }
    }

    /// Evaluates without awaiting while every step is ready, else returns
    /// where it stopped (boxed: it moves into a boxed future anyway).
    pub(crate) fn evaluate(self: &Arc<Self>, parts: &Parts) -> Result<Verdict, Box<Suspended>> {
        self.start_sweeper();
        let mut decisions = Decisions::new();
        for (i, rule) in self.rules.iter().enumerate() {
            match rule.step(parts) {
                Step::Done(o) => {
                    if let Some(v) = fold(&rule.rule, &mut decisions, o) {
                        return Ok(v);
                    }
                }
                Step::Pending(pending) => {
                    return Err(Box::new(Suspended {
                        next: i + 1,
                        decisions,
                        pending,
                    }));
                }
            }
        }
        Ok(Verdict::Allow(decisions))
    }

    /// Finishes an evaluation that had to await.
    pub(crate) async fn resume(
        self: Arc<Self>,
        parts: Parts,
        s: Box<Suspended>,
    ) -> (Parts, Verdict) {
        let mut decisions = s.decisions;
        let outcome = s.pending.await;
        if let Some(v) = fold(&self.rules[s.next - 1].rule, &mut decisions, outcome) {
            return (parts, v);
        }
        for rule in &self.rules[s.next..] {
            let outcome = rule.step(&parts).resolve().await;
            if let Some(v) = fold(&rule.rule, &mut decisions, outcome) {
                return (parts, v);
            }
        }
        (parts, Verdict::Allow(decisions))
    }
}

/// Adds one outcome; returns the verdict when it ends evaluation.
fn fold(rule: &Rule, decisions: &mut Decisions, outcome: Outcome) -> Option<Verdict> {
    match outcome {
        Outcome::Skip => None,
        Outcome::Reject(status) => Some(Verdict::Reject {
            rule: rule.name.clone(),
            status,
            decisions: std::mem::take(decisions),
        }),
        Outcome::Decided(d) => {
            let deny = !d.decision.is_allowed() && !d.shadow;
            decisions.push(d);
            deny.then(|| Verdict::Deny(std::mem::take(decisions)))
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
    #[cfg(feature = "redis")]
    if let Scope::Global(redis) = &rule.scope {
        crate::backend::redis::validate_global(name, &rule.failure, redis, instances)?;
    }
    #[cfg(not(feature = "redis"))]
    let _ = instances;
    if matches!(rule.scope, Scope::Local) && !rule.algorithm.runs_locally() {
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
        if let Cost::Fixed(cost) = rule.cost
            && cost > q.burst()
        {
            return Err(BuildError::CostAboveCapacity {
                rule: rule_err(),
                cost,
                capacity: q.burst(),
            });
        }
    }
    Ok(())
}

/// The quota this instance enforces for `rule`.
fn share(rule: &Rule, q: Quota, instances: u32) -> Quota {
    if rule.split_across_instances {
        q.divided_by(instances)
    } else {
        q
    }
}

impl CompiledRule {
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
            return Step::Done(Outcome::Skip);
        };
        match self.rule.on_missing.lookup(&self.rule.key, parts) {
            Lookup::Ready(found) => self.on_found(found, quota, cost),
            Lookup::Pending(f) => {
                let this = self.clone();
                Step::Pending(Box::pin(async move {
                    this.on_found(f.await, quota, cost).resolve().await
                }))
            }
        }
    }

    fn on_found(self: &Arc<Self>, found: Found, quota: Quota, cost: NonZeroU32) -> Step {
        match found {
            Found::Key(key) => self.decide(key, quota, cost),
            Found::Missing => Step::Done(self.missing()),
            Found::Skip => Step::Done(Outcome::Skip),
        }
    }

    fn missing(&self) -> Outcome {
        match &self.rule.on_missing {
            OnMissingKey::Reject(status) => Outcome::Reject(*status),
            _ => Outcome::Skip,
        }
    }

    fn decide(self: &Arc<Self>, key: Key, quota: Quota, cost: NonZeroU32) -> Step {
        // Static quotas and fixed costs were checked at build time.
        let dynamic = matches!(self.rule.quota, QuotaSource::Dynamic(_));
        if let Some(error) = dynamic.then(|| quota.validate().err()).flatten() {
            tracing::warn!(target: observe::TARGET, rule = %self.rule.name, %quota, %error, "request-time quota admits nothing; denying");
            let d = Decision::never(quota.limit(), quota.window());
            return Step::Done(self.outcome(&key, d, self.local_source()));
        }
        // Before any backend: governor's n-cell arithmetic overflows on a huge
        // cost (a panic in debug, an admit in release).
        let capacity = self.rule.algorithm.capacity(&quota);
        if cost.get() > capacity {
            tracing::warn!(target: observe::TARGET, rule = %self.rule.name, cost = cost.get(), capacity, "request cost above the rule's capacity; denying");
            let d = Decision::never(quota.limit(), quota.window());
            return Step::Done(self.outcome(&key, d, self.local_source()));
        }
        match &self.backend {
            Backend::Local(store) => {
                // Cloning a fresh `Bytes` allocates: only overlong keys pay for it.
                let d = if key.len() <= self.max_key_len {
                    store.check(&key, quota, cost)
                } else {
                    store.check(&key.clone().bounded(self.max_key_len), quota, cost)
                };
                Step::Done(self.outcome(&key, d, Source::Local))
            }
            #[cfg(feature = "redis")]
            Backend::Global(g) => {
                let bounded = key.clone().bounded(self.max_key_len);
                match g.decide_now(&self.rule, &bounded, quota, cost) {
                    Ok((d, source)) => Step::Done(self.outcome(&key, d, source)),
                    Err(()) => {
                        let (this, g) = (self.clone(), g.clone());
                        Step::Pending(Box::pin(async move {
                            let (d, source) = g.ask(&this.rule, &bounded, quota, cost).await;
                            this.outcome(&key, d, source)
                        }))
                    }
                }
            }
        }
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
        if !decision.is_allowed() {
            observe::deny(&self.rule.name, key, &decision, shadow);
        }
        Outcome::Decided(RuleDecision {
            rule: self.rule.name.clone(),
            policy: StaticPolicy::for_decision(&self.policy, &decision),
            decision,
            source,
            shadow,
            concurrency: false,
        })
    }
}

impl Step {
    pub(crate) async fn resolve(self) -> Outcome {
        match self {
            Step::Done(o) => o,
            Step::Pending(f) => f.await,
        }
    }
}
