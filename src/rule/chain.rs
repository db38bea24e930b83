//! The compiled rule chain: evaluates rules in order, sync where it can.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::StatusCode;
use http::request::Parts;

use super::{Cost, OnMissingKey, QuotaSource, Rule, Scope};
use crate::backend::local::LocalStore;
use crate::error::BuildError;
use crate::key::Extracted;
use crate::{Decision, Key, Quota, RuleDecision, Source};

/// Settings the chain shares with every rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainConfig {
    pub(crate) instances: u32,
    pub(crate) max_key_len: usize,
    pub(crate) cleanup_every: Duration,
}

pub(crate) struct CompiledRule {
    rule: Rule,
    backend: LocalStore,
    instances: u32,
    max_key_len: usize,
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
    Allow(Vec<RuleDecision>),
    /// The last decision is the deny (or the rejection's rule is `rule`).
    Deny(Vec<RuleDecision>),
    Reject {
        rule: Arc<str>,
        status: StatusCode,
        decisions: Vec<RuleDecision>,
    },
}

/// Where evaluation stopped to await.
pub(crate) struct Suspended {
    next: usize,
    decisions: Vec<RuleDecision>,
    pending: BoxFuture<'static, Outcome>,
}

pub(crate) struct Chain {
    rules: Vec<Arc<CompiledRule>>,
}

impl Chain {
    pub(crate) fn compile(rules: Vec<Rule>, cfg: ChainConfig) -> Result<Self, BuildError> {
        if rules.is_empty() {
            return Err(BuildError::NoRules);
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(rules.len());
        for rule in rules {
            validate(&rule)?;
            if !seen.insert(rule.name.clone()) {
                return Err(BuildError::DuplicateRule(rule.name.to_string()));
            }
            let fixed = rule.static_quota().map(|q| share(&rule, q, cfg.instances));
            out.push(Arc::new(CompiledRule {
                backend: LocalStore::new(fixed, cfg.cleanup_every),
                rule,
                instances: cfg.instances,
                max_key_len: cfg.max_key_len,
            }));
        }
        Ok(Self { rules: out })
    }

    pub(crate) fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    pub(crate) fn local_keys(&self) -> usize {
        self.rules.iter().map(|r| r.backend.len()).sum()
    }

    pub(crate) fn cleanup(&self) {
        self.rules.iter().for_each(|r| r.backend.cleanup());
    }

    /// Evaluates without awaiting while every step is ready.
    pub(crate) fn evaluate(&self, parts: &Parts) -> Result<Verdict, Suspended> {
        let mut decisions = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.iter().enumerate() {
            match rule.step(parts) {
                Step::Done(o) => {
                    if let Some(v) = fold(&rule.rule, &mut decisions, o) {
                        return Ok(v);
                    }
                }
                Step::Pending(pending) => {
                    return Err(Suspended {
                        next: i + 1,
                        decisions,
                        pending,
                    });
                }
            }
        }
        Ok(Verdict::Allow(decisions))
    }

    /// Finishes an evaluation that had to await.
    pub(crate) async fn resume(self: Arc<Self>, parts: Parts, s: Suspended) -> (Parts, Verdict) {
        let mut decisions = s.decisions;
        let outcome = s.pending.await;
        if let Some(v) = fold(&self.rules[s.next - 1].rule, &mut decisions, outcome) {
            return (parts, v);
        }
        for rule in &self.rules[s.next..] {
            let outcome = match rule.step(&parts) {
                Step::Done(o) => o,
                Step::Pending(f) => f.await,
            };
            if let Some(v) = fold(&rule.rule, &mut decisions, outcome) {
                return (parts, v);
            }
        }
        (parts, Verdict::Allow(decisions))
    }
}

/// Adds one outcome; returns the verdict when it ends evaluation.
fn fold(rule: &Rule, decisions: &mut Vec<RuleDecision>, outcome: Outcome) -> Option<Verdict> {
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

/// Names are sent in headers: non-empty printable ASCII.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}

fn validate(rule: &Rule) -> Result<(), BuildError> {
    let name = &rule.name;
    if !valid_name(name) {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    let rule_err = || name.to_string();
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
        let fallback = match &self.rule.on_missing {
            OnMissingKey::Fallback(k) => Some(k),
            _ => None,
        };
        match self.rule.key.extract(parts) {
            Extracted::Ready(Some(key)) => Step::Done(self.decide(key, quota, cost)),
            Extracted::Ready(None) => match fallback.map(|k| k.extract(parts)) {
                None => Step::Done(self.missing()),
                Some(Extracted::Ready(key)) => Step::Done(self.decide_or_missing(key, quota, cost)),
                Some(Extracted::Pending(f)) => {
                    let this = self.clone();
                    Step::Pending(Box::pin(async move {
                        this.decide_or_missing(f.await, quota, cost)
                    }))
                }
            },
            Extracted::Pending(f) => {
                let this = self.clone();
                let fallback = fallback.map(|k| k.extract(parts));
                Step::Pending(Box::pin(async move {
                    let key = match (f.await, fallback) {
                        (Some(k), _) => Some(k),
                        (None, Some(fb)) => fb.resolve().await,
                        (None, None) => None,
                    };
                    this.decide_or_missing(key, quota, cost)
                }))
            }
        }
    }

    fn missing(&self) -> Outcome {
        match &self.rule.on_missing {
            OnMissingKey::Reject(status) => Outcome::Reject(*status),
            _ => Outcome::Skip,
        }
    }

    fn decide_or_missing(&self, key: Option<Key>, quota: Quota, cost: NonZeroU32) -> Outcome {
        match key {
            Some(key) => self.decide(key, quota, cost),
            // A fallback that finds nothing skips; only a missing primary key rejects.
            None if matches!(self.rule.on_missing, OnMissingKey::Fallback(_)) => Outcome::Skip,
            None => self.missing(),
        }
    }

    fn decide(&self, key: Key, quota: Quota, cost: NonZeroU32) -> Outcome {
        let name = &self.rule.name;
        let decision = if let Err(error) = quota.validate() {
            tracing::warn!(rule = %name, %quota, %error, "request-time quota admits nothing; denying");
            Decision::never(quota.limit(), quota.window())
        } else {
            self.backend
                .check(&key.clone().bounded(self.max_key_len), quota, cost)
        };
        let shadow = self.rule.shadow;
        if !decision.is_allowed() {
            record_deny(name, &key, &decision, shadow);
        }
        Outcome::Decided(RuleDecision {
            rule: name.clone(),
            decision,
            source: Source::Local,
            shadow,
            concurrency: false,
        })
    }
}

/// Every deny is logged (with a key fingerprint, never the key) and counted.
pub(crate) fn record_deny(rule: &Arc<str>, key: &Key, d: &Decision, shadow: bool) {
    let retry_after_ms = d.retry_after().map(|w| w.as_millis() as u64);
    if shadow {
        tracing::info!(target: "keyed_rate_limit", rule = %rule, key = %key.fingerprint(), ?retry_after_ms, "shadow rule would deny");
    } else {
        tracing::info!(target: "keyed_rate_limit", rule = %rule, key = %key.fingerprint(), ?retry_after_ms, "rate limited");
    }
    let outcome = if shadow { "shadow_deny" } else { "deny" };
    metrics::counter!("rate_limit_decisions_total", "rule" => rule.clone(), "outcome" => outcome)
        .increment(1);
}
